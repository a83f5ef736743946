"""Where a DBOS refund's time goes: cProfile over sequential refunds, grouped by function.

Work the product hands to worker threads runs inline while profiling (``inline_threads``). Reports,
per refund, the cumulative time of DBOS's step machinery and the database round trips under it,
and the call counts that explain them (statements executed, commits, transactions started).
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks import harness
from benchmarks.cost import _run_batch, started_bench

#: (label, file suffix, function name): the rows the report shows, in order.
FUNCTIONS = [
    ("DBOS step wrapper (all checkpointed calls)", "dbos/_core.py", "invoke_step"),
    ("datasource transaction step", "dbos/_datasource.py", "run_tx_step"),
    ("  its app-DB transaction + checkpoint row", "dbos/_datasource.py", "_body"),
    ("  check for a recorded result (app DB)", "dbos/_datasource.py", "_check_execution"),
    ("  ownership check after the write (system DB)", "dbos/_datasource.py", "_still_owns"),
    ("record a step's result (system DB)", "dbos/_sys_db.py", "record_operation_result"),
    ("  owner check inside it", "dbos/_sys_db.py", "_check_owner_txn"),
    ("check for a recorded step (system DB)", "dbos/_sys_db.py", "check_operation_execution"),
    ("set_event", "dbos/_dbos.py", "set_event_async"),
    ("SQLAlchemy execute (all statements)", "sqlalchemy/engine/base.py", "execute"),
    ("SQLAlchemy commit", "sqlalchemy/engine/base.py", "commit"),
    ("psycopg wait for the server", "psycopg/connection.py", "wait"),
    ("pydantic-ai agent run (model + tools)", "pydantic_ai/agent/abstract.py", "run"),
    ("payments API call (stripe)", "stripe/_http_client.py", "request_with_retries"),
]


def _rows(stats: pstats.Stats, refunds: int) -> list[dict[str, Any]]:
    table: dict[tuple[str, str], tuple[float, float, int]] = {}
    for (filename, _line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for _label, suffix, name in FUNCTIONS:
            if func == name and filename.endswith(suffix):
                ct, tt, nc = table.get((suffix, name), (0.0, 0.0, 0))
                table[(suffix, name)] = (ct + cumtime, tt + tottime, nc + ncalls)
    rows = []
    for label, suffix, name in FUNCTIONS:
        ct, _tt, nc = table.get((suffix, name), (0.0, 0.0, 0))
        rows.append(
            {
                "what": label,
                "function": f"{suffix}:{name}",
                "ms_per_refund": ct * 1000 / refunds,
                "calls_per_refund": nc / refunds,
            }
        )
    return rows


async def _inline(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return func(*args, **kwargs)


@contextmanager
def inline_threads() -> Iterator[None]:
    """``asyncio.to_thread`` runs its function inline, on the event loop's thread, while profiling.

    The product runs synchronous steps (and DBOS its checkpoint I/O) on worker threads, which cProfile,
    following one thread, would not see. The profiled refunds run one at a time, so running that work
    inline changes where it runs, not what it does.
    """
    with mock.patch("asyncio.to_thread", _inline):
        yield


async def run_section(*, refunds: int, server: str, sandbox_url: str, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in harness.BACKENDS:
        with harness.databases(backend, server, workdir) as dbs:
            async with started_bench(dbs, sandbox_url, workdir) as bench:
                await _run_batch(bench, "dbos", 3, server)
                unprofiled = await _run_batch(bench, "dbos", refunds, server)
                profiler = cProfile.Profile()
                with inline_threads():
                    profiler.enable()
                    profiled = await _run_batch(bench, "dbos", refunds, server)
                    profiler.disable()
                stats = pstats.Stats(profiler)
                out[backend] = {
                    "refunds": refunds,
                    "wall_ms_unprofiled": unprofiled["wall_ms"],
                    "wall_ms_profiled": profiled["wall_ms"],
                    "rows": _rows(stats, refunds),
                    "steps": _step_names(dbs.system_url, unprofiled["ids"][:1]),
                }
        print(f"  profile {backend}: done", flush=True)
    return out


def _step_names(system_url: str, ids: list[str]) -> list[str]:
    """The checkpointed operations of one refund, in order (what the floor's N counts)."""
    import sqlalchemy as sa

    from steps.store import create_engine

    engine = create_engine(system_url)
    schema = "" if system_url.startswith("sqlite") else "dbos."  # a constant, never input
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT function_name FROM {schema}operation_outputs "  # noqa: S608
                    "WHERE workflow_uuid = :id ORDER BY function_id"
                ),
                {"id": ids[0]},
            )
            return [r.function_name for r in rows]
    finally:
        engine.dispose()
