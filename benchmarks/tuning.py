"""Section 4: DBOS knobs, each measured against the product's setting in the same run.

Every knob has two arms: the product's current setting first, the alternative second. Each arm gets its
own fresh databases (some settings, like LISTEN/NOTIFY, are fixed when the system database is created);
rounds alternate the arms and every round relaunches DBOS. The workload is the one the knob can change:
sequential auto-approved refunds (cost per refund), refunds at concurrency 16 (refunds/s), or the
approval path (start and park, approve as the API does, the continuation pays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbos import DBOSPortableJSONSerializer

from benchmarks import harness
from benchmarks.cost import started_bench
from benchmarks.harness import median, ratio
from benchmarks.throughput import closed_loop


@dataclass(frozen=True)
class Arm:
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    variant: str = "dbos"


@dataclass(frozen=True)
class Knob:
    name: str
    backend: str
    workload: str  # "sequential" | "concurrent" | "approval"
    product: Arm
    alternative: Arm


def knobs() -> list[Knob]:
    return [
        Knob(
            "SQLite journal",
            "sqlite",
            "sequential",
            Arm("WAL + synchronous=NORMAL (product engine)"),
            Arm("DBOS's own engine (rollback journal)", config={"system_database_engine": harness.drop_key()}),
        ),
        Knob(
            "async workflows vs threads",
            "postgres",
            "concurrent",
            Arm("asyncio tasks, async API"),
            Arm("16 threads, sync API", variant="dbos_threads"),
        ),
        Knob(
            "async workflows vs threads",
            "sqlite",
            "concurrent",
            Arm("asyncio tasks, async API"),
            Arm("16 threads, sync API", variant="dbos_threads"),
        ),
        Knob(
            "system DB pool size",
            "postgres",
            "concurrent",
            Arm("DBOS default (20)"),
            Arm("sys_db_pool_size=5", config={"sys_db_pool_size": 5}),
        ),
        Knob(
            "pool_pre_ping",
            "postgres",
            "sequential",
            Arm("off (product)"),
            Arm("on (DBOS default)", config={"db_engine_kwargs": {"pool_pre_ping": True}}),
        ),
        Knob(
            "serializer",
            "postgres",
            "sequential",
            Arm("tagged JSON (product)"),
            Arm("pickle (DBOS default)", config={"serializer": harness.drop_key()}),
        ),
        Knob(
            "serializer, portable",
            "postgres",
            "sequential",
            Arm("tagged JSON (product)"),
            Arm("portable JSON", config={"serializer": DBOSPortableJSONSerializer()}),
        ),
        Knob(
            "notifications",
            "postgres",
            "approval",
            Arm("LISTEN/NOTIFY (default)"),
            Arm("polling, use_listen_notify=False", config={"use_listen_notify": False}),
        ),
        Knob(
            "notification polling interval",
            "sqlite",
            "approval",
            Arm("0.25 s (product default)"),
            Arm("0.05 s", settings={"notification_polling_interval_seconds": 0.05}),
        ),
    ]


async def _measure(bench: Any, arm: Arm, workload: str, refunds: int, concurrency: int, server: str) -> dict[str, Any]:
    if workload == "concurrent":
        run, amount = bench.runner(arm.variant)
        batch = [harness.new_refund(f"tune-{arm.variant}", amount) for _ in range(max(refunds, 2 * concurrency))]
        result = await closed_loop(run, batch, concurrency)
        return {"value": result["refunds_per_s"], "unit": "refunds/s", "errors": result["errors"]}
    from benchmarks.cost import _run_batch

    variant = "dbos_approval" if workload == "approval" else arm.variant
    sample = await _run_batch(bench, variant, refunds, server)
    errors = [f"{sample['failed']} of {refunds} refunds did not complete"] if sample["failed"] else []
    return {"value": sample["wall_ms"], "unit": "ms/refund", "cpu_ms": sample["cpu_ms"], "errors": errors}


async def run_section(
    *, rounds: int, refunds: int, concurrency: int, server: str, sandbox_url: str, workdir: Path, only: str | None
) -> dict[str, Any]:
    results = []
    for knob in knobs():
        if only and only.lower() not in knob.name.lower():
            continue
        print(f"  tuning: {knob.name} ({knob.backend})", flush=True)
        arms = (knob.product, knob.alternative)
        values: dict[str, list[dict[str, Any]]] = {a.label: [] for a in arms}
        error: str | None = None
        with (
            harness.databases(knob.backend, server, workdir) as dbs_a,
            harness.databases(knob.backend, server, workdir) as dbs_b,
        ):
            arm_dbs = {knob.product.label: dbs_a, knob.alternative.label: dbs_b}
            try:
                for r in range(rounds):
                    for arm in arms if r % 2 == 0 else tuple(reversed(arms)):
                        async with started_bench(
                            arm_dbs[arm.label],
                            sandbox_url,
                            workdir,
                            arm.config,
                            arm.settings,
                            queues=knob.workload == "approval",  # the continuation comes from a queue
                        ) as bench:
                            await _measure(bench, arm, knob.workload, 1, 1, server)  # warm-up
                            values[arm.label].append(
                                await _measure(bench, arm, knob.workload, refunds, concurrency, server)
                            )
            except Exception as exc:  # an alternative that breaks the workflow is a result, not a crash
                error = f"{type(exc).__name__}: {exc}"[:300]
        med = {label: median([v["value"] for v in vs]) for label, vs in values.items()}
        a, b = med[knob.product.label], med[knob.alternative.label]
        unit = next((v["unit"] for vs in values.values() for v in vs), "")
        failures = {label: sorted({e for v in vs for e in v["errors"]}) for label, vs in values.items()}
        results.append(
            {
                "knob": knob.name,
                "backend": knob.backend,
                "workload": knob.workload,
                "unit": unit,
                "product": knob.product.label,
                "alternative": knob.alternative.label,
                "product_value": a,
                "alternative_value": b,
                "alternative_vs_product": ratio(b, a),
                "rounds": {label: len(vs) for label, vs in values.items()},
                "samples": values,
                "error": error,
                "failures": failures,
                "correct": error is None and not any(failures.values()),
            }
        )
    return {"knobs": results}
