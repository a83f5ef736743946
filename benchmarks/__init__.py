"""Benchmarks: scripts run by hand (``python -m benchmarks.<name>``), not tests. See benchmarks/README.md."""
