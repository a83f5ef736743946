"""Section 1: the cost of durability per refund, next to no durability, the commit floor and LangGraph.

Each round, on each backend: the product runtime is started on fresh-per-run databases, one warm-up
refund per variant runs, then every variant runs ``refunds`` refunds one after the other (variant order
rotates from round to round). The auto-approved variants run with the queues polled only every 30 s
(nothing is queued); the approval path, whose continuation comes from the ``approvals`` queue, runs
in a runtime of its own with the product's polling. Commits are counted in a separate pass (Postgres:
pg_stat_database of the run's own databases, after the counters settle, less the runtime's idle rate
and the benchmark's own reads of the continuation's status; SQLite: COMMIT statements on this
process's connections).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import flows, harness
from benchmarks import langgraph_flow as lg
from benchmarks.harness import APPROVAL_AMOUNT, AUTO_AMOUNT, Databases, median, ratio

#: auto-approved refunds; the approval path variants below start, park, approve and finish a refund.
AUTO_VARIANTS = ("dbos", "plain", "floor", "langgraph", "langgraph_plain")
APPROVAL_VARIANTS = ("dbos_approval", "langgraph_approval")
LABELS = {
    "dbos": "DBOS workflow (product)",
    "plain": "same logic, no durability",
    "floor": "floor: N x (INSERT + COMMIT)",
    "langgraph": "LangGraph + saver, durability=sync",
    "langgraph_plain": "same LangGraph graph, no checkpointer",
    "dbos_approval": "DBOS, approval path (park, decide, continue)",
    "langgraph_approval": "LangGraph, approval path (interrupt/resume)",
}
#: What the approval-path variants measure; results without it measured a workflow waiting in recv.
APPROVAL_PATH = "park, decide, continue"
#: The approval paths' labels in results from before a parked refund became rows (it waited in recv).
RECV_LABELS = {
    "dbos_approval": "DBOS, approval path (recv/send, earlier design)",
    "langgraph_approval": "LangGraph, approval path (interrupt/resume, earlier design)",
}
#: Settings for runs that use no queue, so that its poller adds no transactions.
QUIET = {"queue_polling_interval_seconds": 30.0}
#: Each group of variants runs in its own runtime; True: with the product's queue polling.
GROUPS: tuple[tuple[tuple[str, ...], bool], ...] = ((AUTO_VARIANTS, False), (APPROVAL_VARIANTS, True))


@dataclass
class Bench:
    """One backend's live pieces for a round."""

    dbs: Databases
    rt: Any
    floor: flows.Floor
    graph: Any
    graph_plain: Any
    checkpoints: float  # DBOS checkpoints per refund: operation_outputs + workflow_status rows

    def runner(self, variant: str) -> tuple[Callable[[str, Any], Awaitable[Any]], Any]:
        """(run one refund, amount) for a variant."""

        async def floor(refund_id: str, _request: Any) -> None:
            self.floor.checkpoints(refund_id, round(self.checkpoints))

        async def in_thread(fn: Callable[..., Any], refund_id: str, request: Any) -> Any:
            return await harness.off_loop(fn, self.graph, refund_id, request)

        async def langgraph_plain(refund_id: str, request: Any) -> Any:
            return await harness.off_loop(lg.run_refund, self.graph_plain, refund_id, request)

        async def plain(refund_id: str, request: Any) -> Any:
            return await flows.plain_refund(refund_id, request, self.rt)

        table: dict[str, tuple[Callable[[str, Any], Awaitable[Any]], Any]] = {
            "dbos": (flows.dbos_refund, AUTO_AMOUNT),
            "plain": (plain, AUTO_AMOUNT),
            "floor": (floor, AUTO_AMOUNT),
            "langgraph": (lambda i, r: in_thread(lg.run_refund, i, r), AUTO_AMOUNT),
            "langgraph_plain": (langgraph_plain, AUTO_AMOUNT),
            "dbos_approval": (flows.dbos_approved_refund, APPROVAL_AMOUNT),
            "langgraph_approval": (lambda i, r: in_thread(lg.run_approved_refund, i, r), APPROVAL_AMOUNT),
            "dbos_threads": (lambda i, r: harness.off_loop(flows.dbos_refund_sync, i, r), AUTO_AMOUNT),
        }
        return table[variant]


class started_bench:
    """The runtime and LangGraph's saver for one backend. DBOS is launched and destroyed off the event
    loop (its synchronous set-up refuses to run inside one)."""

    def __init__(
        self,
        dbs: Databases,
        sandbox_url: str,
        workdir: Path,
        config: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        *,
        queues: bool = False,
    ) -> None:
        """``queues``: poll the queues as the product does (the approval path needs its continuation's)."""
        self.dbs, self.sandbox_url, self.workdir, self.config = dbs, sandbox_url, workdir, config
        self.settings = {**({} if queues else QUIET), **(settings or {})}

    async def __aenter__(self) -> Bench:
        settings = harness.settings_for(self.dbs, self.sandbox_url, self.workdir, **self.settings)
        self._rt_cm = harness.started(settings, self.config)
        rt = await harness.off_loop(self._rt_cm.__enter__)
        lg.ctx.limits = rt.limits
        lg.ctx.model_label = rt.model_label
        floor_url = (
            f"sqlite:///{self.dbs.sqlite_dir}/floor.sqlite" if self.dbs.backend == "sqlite" else self.dbs.system_url
        )
        self._saver_cm = lg.saver(self.dbs.backend, self.dbs.langgraph_url)
        saver = self._saver_cm.__enter__()
        self.bench = Bench(
            self.dbs, rt, flows.Floor(self.dbs.backend, floor_url), lg.build_graph(saver), lg.build_graph(None), 0
        )
        return self.bench

    async def __aexit__(self, *exc: object) -> None:
        self.bench.floor.close()
        self._saver_cm.__exit__(None, None, None)
        await harness.off_loop(self._rt_cm.__exit__, None, None, None)


async def _run_batch(bench: Bench, variant: str, n: int, server: str) -> dict[str, Any]:
    run, amount = bench.runner(variant)
    tag = variant
    refunds = [harness.new_refund(tag, amount) for _ in range(n)]  # registered before the clock starts
    wal0 = harness.pg_wal_lsn(server) if bench.dbs.backend == "postgres" else 0
    sq0 = harness.sqlite_commits.count
    cpu0, t0 = harness.cpu_seconds(), time.perf_counter()
    failed = 0
    for refund_id, request in refunds:
        result = await run(refund_id, request)
        if variant != "floor" and (not isinstance(result, dict) or result.get("status") != "completed"):
            failed += 1  # a refund that did not complete makes the sample wrong, not fast
    wall, cpu = time.perf_counter() - t0, harness.cpu_seconds() - cpu0
    sample: dict[str, Any] = {"refunds": n, "failed": failed, "wall_ms": wall * 1000 / n, "cpu_ms": cpu * 1000 / n}
    if bench.dbs.backend == "postgres":
        sample["wal_bytes"] = (harness.pg_wal_lsn(server) - wal0) / n
    else:
        sample["commits"] = (harness.sqlite_commits.count - sq0) / n
    sample["ids"] = [r[0] for r in refunds]
    return sample


def _count_checkpoints(bench: Bench, ids: list[str]) -> None:
    counted = flows.dbos_checkpoints(bench.dbs.system_url, ids)
    bench.checkpoints = counted["operation_outputs"] + counted["workflow_status"]


async def _pg_commit_pass(bench: Bench, variants: tuple[str, ...], n: int, server: str) -> dict[str, float]:
    """Commits per refund from pg_stat_database: all refunds registered first, then each variant runs in
    its own window between two settled readings; idle background commits are measured and subtracted,
    and so are the benchmark's own status reads while it waits for an approved refund's continuation."""
    batches = {v: [harness.new_refund(f"count-{v}", bench.runner(v)[1]) for _ in range(n)] for v in variants}
    harness.settle_pg_stats()
    c0, t0 = harness.pg_commits(bench.dbs, server), time.monotonic()
    harness.settle_pg_stats()
    c1, t1 = harness.pg_commits(bench.dbs, server), time.monotonic()
    idle_rate = (c1 - c0) / (t1 - t0)
    out: dict[str, float] = {"idle_commits_per_s": idle_rate}
    c0, t0 = c1, t1
    for variant in variants:
        run, _amount = bench.runner(variant)
        polls = flows.StatusPolls.count
        for refund_id, request in batches[variant]:
            await run(refund_id, request)
        polls = flows.StatusPolls.count - polls
        harness.settle_pg_stats()
        c1, t1 = harness.pg_commits(bench.dbs, server), time.monotonic()
        out[variant] = (c1 - c0 - idle_rate * (t1 - t0) - polls) / n
        c0, t0 = c1, t1
    return out


async def run_section(
    *, rounds: int, refunds: int, count_refunds: int, server: str, sandbox_url: str, workdir: Path
) -> dict[str, Any]:
    variants = AUTO_VARIANTS + APPROVAL_VARIANTS
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {b: {v: [] for v in variants} for b in harness.BACKENDS}
    extra: dict[str, dict[str, Any]] = {b: {} for b in harness.BACKENDS}
    with ExitStack() as stack:
        # Each group on databases of its own: DBOS stores a queue's polling interval with the queue, and a
        # worker that finds 30 s there converges to a shorter one registered later only by 10% per poll.
        all_dbs = {
            (backend, queues): stack.enter_context(harness.databases(backend, server, workdir))
            for backend in harness.BACKENDS
            for _, queues in GROUPS
        }
        for r in range(rounds):
            for backend in harness.BACKENDS:
                for group, queues in GROUPS:
                    async with started_bench(all_dbs[backend, queues], sandbox_url, workdir, queues=queues) as bench:
                        await _round(bench, group, r, refunds, server, samples[backend], extra[backend])
                print(f"  cost round {r + 1}/{rounds} {backend}: done", flush=True)
        if count_refunds > 0:
            commits: dict[str, float] = {}
            for group, queues in GROUPS:
                async with started_bench(all_dbs["postgres", queues], sandbox_url, workdir, queues=queues) as bench:
                    warm = await _run_batch(bench, "dbos", 2, server)
                    _count_checkpoints(bench, warm["ids"])
                    counted = await _pg_commit_pass(bench, group, count_refunds, server)
                    idle = counted.pop("idle_commits_per_s")
                    commits.update(counted)
                    commits["idle_commits_per_s" if not queues else "idle_commits_per_s_polling"] = idle
            extra["postgres"]["commits"] = commits
    summary = summarize(samples, extra)
    return {"approval_path": APPROVAL_PATH, "samples": samples, "extra": extra, "summary": summary}


async def _round(
    bench: Bench,
    group: tuple[str, ...],
    r: int,
    refunds: int,
    server: str,
    samples: dict[str, list[dict[str, Any]]],
    extra: dict[str, Any],
) -> None:
    """One round of a group of variants on one backend: warm-ups, then each variant's batch, rotated by round."""
    warm = await _run_batch(bench, "dbos", 2, server)
    _count_checkpoints(bench, warm["ids"])
    extra["dbos_checkpoints_per_refund"] = bench.checkpoints
    for v in group:
        if v != "dbos":
            await _run_batch(bench, v, 1, server)
    order = group[r % len(group) :] + group[: r % len(group)]
    for v in order:
        sample = await _run_batch(bench, v, refunds, server)
        if v in ("langgraph", "langgraph_approval"):
            key = "langgraph_rows_per_refund" if v == "langgraph" else "langgraph_approval_rows_per_refund"
            extra[key] = lg.checkpoints_per_refund(bench.dbs.backend, bench.dbs.langgraph_url, sample["ids"])
        if v == "dbos_approval":
            extra["dbos_approval_checkpoints_per_refund"] = sum(
                flows.dbos_checkpoints(bench.dbs.system_url, sample["ids"]).values()
            )
        del sample["ids"]
        samples[v].append(sample)


def _med(samples: list[dict[str, Any]], key: str) -> float | None:
    return median([s[key] for s in samples if s.get(key) is not None])


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> float | None:
    """Median over rounds of a - b (the same round's numbers, so shared noise cancels)."""
    return median([x[key] - y[key] for x, y in zip(a, b, strict=False)])


def summarize(samples: dict[str, dict[str, list[dict[str, Any]]]], extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend, by_variant in samples.items():
        rows: dict[str, Any] = {}
        for v, s in by_variant.items():
            row = {
                "wall_ms": _med(s, "wall_ms"),
                "cpu_ms": _med(s, "cpu_ms"),
                "rounds": len(s),
                "failed": sum(x["failed"] for x in s),
            }
            if backend == "postgres":
                row["wal_bytes"] = _med(s, "wal_bytes")
                row["commits"] = extra[backend].get("commits", {}).get(v)
            else:
                row["commits"] = _med(s, "commits")
            rows[v] = row
        dbos_over = _paired(by_variant["dbos"], by_variant["plain"], "wall_ms")
        lg_over = _paired(by_variant["langgraph"], by_variant["langgraph_plain"], "wall_ms")
        floor = rows["floor"]["wall_ms"]
        out[backend] = {
            "rows": rows,
            "dbos_overhead_ms": dbos_over,
            "dbos_overhead_cpu_ms": _paired(by_variant["dbos"], by_variant["plain"], "cpu_ms"),
            "langgraph_overhead_ms": lg_over,
            "langgraph_overhead_cpu_ms": _paired(by_variant["langgraph"], by_variant["langgraph_plain"], "cpu_ms"),
            "floor_ms": floor,
            "dbos_overhead_vs_langgraph": ratio(dbos_over, lg_over),
            "dbos_overhead_vs_floor": ratio(dbos_over, floor),
            "checkpoints_per_refund": extra[backend].get("dbos_checkpoints_per_refund"),
        }
    return out
