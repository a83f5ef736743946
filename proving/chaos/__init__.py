"""The reliability soak: seeded workload, random kills and payment faults, and a counted verdict."""

from proving.chaos.run import ChaosConfig, run_chaos

__all__ = ["ChaosConfig", "run_chaos"]
