"""refund-agent: a durable AI refund agent."""

__version__ = "0.1.0"
