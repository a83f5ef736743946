"""Section 2: refunds/s at concurrency 1, 4, 16, 64 (closed loop, in one process).

C workers each take the next registered refund and run it to its end, until ``refunds`` are done.
DBOS workflows are started in this process with the async API (asyncio tasks on one event loop, as the
service's worker runs them); LangGraph's synchronous graph runs on C threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.cost import Bench, started_bench
from benchmarks.harness import median
from benchmarks.http_load import percentile

VARIANTS = ("dbos", "langgraph")


async def closed_loop(
    run: Callable[[str, Any], Awaitable[Any]], refunds: list[tuple[str, Any]], concurrency: int
) -> dict[str, Any]:
    pending = list(reversed(refunds))
    latencies: list[float] = []
    errors: list[str] = []

    async def worker() -> None:
        while pending:
            refund_id, request = pending.pop()
            t0 = time.perf_counter()
            try:
                result = await run(refund_id, request)
            except Exception as error:  # counted, not hidden
                errors.append(type(error).__name__)
                continue
            if not isinstance(result, dict) or result.get("status") != "completed":
                errors.append(f"status {result.get('status') if isinstance(result, dict) else result!r}")
                continue
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        "refunds": len(refunds),
        "completed": len(latencies),
        "errors": errors,
        "wall_s": wall,
        "refunds_per_s": len(latencies) / wall,
        "latency_p50_ms": (percentile(latencies, 50) or 0) * 1000,
        "latency_p99_ms": (percentile(latencies, 99) or 0) * 1000,
    }


async def _cell(bench: Bench, variant: str, concurrency: int, refunds: int) -> dict[str, Any]:
    run, amount = bench.runner(variant)
    batch = [harness.new_refund(f"tp-{variant}-{concurrency}", amount) for _ in range(refunds)]
    return await closed_loop(run, batch, concurrency)


async def run_section(
    *,
    rounds: int,
    levels: Sequence[int],
    refunds_per_level: Callable[[int], int],
    server: str,
    sandbox_url: str,
    workdir: Path,
) -> dict[str, Any]:
    samples: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        b: {v: {str(c): [] for c in levels} for v in VARIANTS} for b in harness.BACKENDS
    }
    with harness.databases("postgres", server, workdir) as pg_dbs, harness.databases("sqlite", server, workdir) as sq:
        all_dbs = {"postgres": pg_dbs, "sqlite": sq}
        for r in range(rounds):
            for backend in harness.BACKENDS:
                async with started_bench(all_dbs[backend], sandbox_url, workdir) as bench:
                    for v in VARIANTS:
                        await _cell(bench, v, 1, 1)  # warm-up
                    for c in levels:
                        order = VARIANTS if (r + c) % 2 == 0 else tuple(reversed(VARIANTS))
                        for v in order:
                            samples[backend][v][str(c)].append(await _cell(bench, v, c, refunds_per_level(c)))
                print(f"  throughput round {r + 1}/{rounds} {backend}: done", flush=True)
    summary = {
        b: {
            v: {
                c: {
                    "refunds_per_s": median([s["refunds_per_s"] for s in cells]),
                    "latency_p50_ms": median([s["latency_p50_ms"] for s in cells]),
                    "latency_p99_ms": median([s["latency_p99_ms"] for s in cells]),
                    "errors": sum(len(s["errors"]) for s in cells),
                }
                for c, cells in by_level.items()
            }
            for v, by_level in by_variant.items()
        }
        for b, by_variant in samples.items()
    }
    return {"samples": samples, "summary": summary}
