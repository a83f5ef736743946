"""Decision-quality evaluation: the agent's refund decisions on a fixed dataset, with any model.

`refund-agent eval` (or `python -m proving.evals`) runs every case of `dataset.yaml` through the real
agent and tools against a throwaway order store, asks policy for the verdict, and scores it with
pydantic-evals evaluators. Nothing is paid: the agent has no paying tool and the harness stops at
the verdict.
"""
