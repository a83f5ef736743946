"""Who the benchmarks' refunds are requested by and decided by (never the same principal)."""

from __future__ import annotations

from agent.identity import Principal
from steps.refunds import Requester

BENCH_REQUESTER = Requester(principal="client:bench")
BENCH_APPROVER = Principal("operator", "bench-approver")
