"""What exercises the product from outside: the demo, the chaos soak, the model evals.

It imports the product; the product never imports it. Its commands reach `refund-agent` through the
`refund_agent.commands` entry points (see pyproject.toml).
"""
