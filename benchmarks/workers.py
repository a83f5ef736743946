"""Worker scale-out: refunds/s drained by 1 vs 2 `refund-agent worker` processes on Postgres, in one run.

    python -m benchmarks.workers --refunds 200 [--workers 1,2] [--rounds 2] [--worker-concurrency 4]

For each configuration (alternating, ``--rounds`` times): two fresh Postgres databases on 127.0.0.1,
migrated and seeded by `refund-agent migrate` / `seed`; the payments sandbox as a subprocess; N
auto-approved refunds (one minor unit each, spread over five seeded orders) enqueued on the `refunds`
queue before any worker runs; then K workers (offline model, QUEUE_WORKER_CONCURRENCY each) drain it.

Throughput is measured on DBOS's own timestamps: completed refunds / (last workflow end - first
dequeue), so process start-up is not counted. Also reported: each worker's share of the refunds and
p50/p99 of dequeue -> end. Printed as Markdown; written as JSON to benchmarks/results/workers-<ts>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from agent.ops.processes import free_port, http_ok, wait_for
from benchmarks.http_load import percentile
from benchmarks.identities import BENCH_REQUESTER
from benchmarks.limits import SERIAL_RULE_OFF_ENV

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
RESULTS = Path(__file__).resolve().parent / "results"
ORDERS = [("ord_1001", "0.01"), ("ord_1002", "0.01"), ("ord_1003", "0.01"), ("ord_1007", "0.01"), ("ord_1010", "0.01")]
API_KEY = "sk_test_bench"


def _database_url(server: str, name: str) -> str:
    parts = urlsplit(server.replace("postgresql+psycopg://", "postgresql://"))
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def fresh_databases(server: str) -> Iterator[tuple[str, str]]:
    names = [f"bench_workers_{secrets.token_hex(4)}_{role}" for role in ("sys", "app")]
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _database_url(server, names[0]), _database_url(server, names[1])
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_once(server: str, refunds: int, workers: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    from agent.domain import RefundRequest
    from agent.submit import submit_refund
    from benchmarks import harness

    with fresh_databases(server) as (system_url, app_url):
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("REFUND_AGENT_", "QUEUE_", "PAYMENTS_"))},
            "DBOS_SYSTEM_DATABASE_URL": system_url,
            "DATABASE_URL": app_url,
            "PAYMENTS_API_BASE": f"http://127.0.0.1:{port}",
            "PAYMENTS_API_KEY": API_KEY,
            "REFUND_AGENT_DATA_DIR": str(workdir / "data"),
            "QUEUE_WORKER_CONCURRENCY": str(concurrency),
            "QUEUE_POLLING_INTERVAL_SECONDS": "0.1",
            "NOTIFICATION_POLLING_INTERVAL_SECONDS": "0.1",
            **SERIAL_RULE_OFF_ENV,
        }
        env.pop("REFUND_AGENT_MODEL", None)
        cli = [sys.executable, "-m", "agent.cli"]
        logs: list[Any] = []
        procs: list[subprocess.Popen[bytes]] = []

        def start(name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
            out = (workdir / f"{name}.log").open("ab")
            logs.append(out)
            proc = subprocess.Popen([*cli, *args], env={**env, **extra}, cwd=workdir, stdout=out, stderr=out)
            procs.append(proc)
            return proc

        try:
            for step in (["migrate"], ["seed"]):
                subprocess.run([*cli, *step], env=env, cwd=workdir, check=True, capture_output=True, timeout=120)
            start("sandbox", ["sandbox-payments", "--port", str(port)])
            wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/_sandbox/healthz"), timeout=60, what="the sandbox")
            with harness.submitting(workdir / "data", system_url, app_url) as (settings, client):
                ids = []
                for i in range(refunds):
                    order_id, amount = ORDERS[i % len(ORDERS)]
                    request = RefundRequest(
                        order_id=order_id, message=f"Please refund {amount}", amount=Decimal(amount)
                    )
                    refund_id = f"bench-{workers}w-{i:05d}"
                    submit_refund(
                        client,
                        idempotency_key=refund_id,
                        request=request,
                        requester=BENCH_REQUESTER,
                        app_version=settings.runtime.app_version,
                    )
                    ids.append(refund_id)
                for w in range(workers):
                    start(f"worker-{w}", ["worker"], REFUND_AGENT_EXECUTOR_ID=f"bench-worker-{w}")

                def finished() -> list[Any] | None:
                    done = client.list_workflows(
                        status=["SUCCESS", "ERROR"], queue_name="refunds", load_input=False, load_output=True
                    )
                    return done if len(done) >= refunds else None

                done = wait_for(finished, timeout=max(120, refunds), what="the queue to drain", interval=0.5)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for out in logs:
                out.close()
    starts = [w.dequeued_at for w in done if w.dequeued_at]
    ends = [w.updated_at for w in done if w.updated_at]
    window = (max(ends) - min(starts)) / 1000
    completed = sum(1 for w in done if w.status == "SUCCESS" and (w.output or {}).get("status") == "completed")
    latencies = [(w.updated_at - w.dequeued_at) / 1000 for w in done if w.updated_at and w.dequeued_at]
    return {
        "workers": workers,
        "worker_concurrency": concurrency,
        "refunds": refunds,
        "completed": completed,
        "drain_s": round(window, 3),
        "refunds_per_s": round(completed / window, 2),
        "per_worker": dict(sorted(Counter(w.executor_id for w in done).items())),
        "latency_s": {"p50": round(percentile(latencies, 50) or 0, 3), "p99": round(percentile(latencies, 99) or 0, 3)},
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = ["| workers | round | completed | drain s | **refunds/s** | p50 / p99 s (dequeue -> end) | per worker |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        share = ", ".join(f"{n}" for n in run["per_worker"].values())
        rows.append(
            f"| {run['workers']} | {run['round']} | {run['completed']}/{run['refunds']} | {run['drain_s']} | "
            f"**{run['refunds_per_s']}** | {run['latency_s']['p50']} / {run['latency_s']['p99']} | {share} |"
        )
    by_workers: dict[int, list[float]] = {}
    for run in runs:
        by_workers.setdefault(run["workers"], []).append(run["refunds_per_s"])
    medians = {k: round(statistics.median(v), 2) for k, v in by_workers.items()}
    if 1 in medians and len(medians) > 1:
        rows.append("")
        for k, v in sorted(medians.items()):
            rows.append(f"- {k} worker(s): median {v} refunds/s ({v / medians[1]:.2f}x one worker)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refunds", type=int, default=200)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to compare")
    parser.add_argument("--rounds", type=int, default=2, help="each configuration this many times, alternating")
    parser.add_argument("--worker-concurrency", type=int, default=4)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if (urlsplit(args.postgres_url).hostname or "") not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("--postgres-url must point at this machine")
    counts = [int(c) for c in args.workers.split(",")]
    started = datetime.now(UTC)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for count in counts:
            with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
                result = run_once(args.postgres_url, args.refunds, count, args.worker_concurrency, Path(tmp))
            result["round"] = round_
            runs.append(result)
            print(f"round {round_}, {count} worker(s): {result['refunds_per_s']} refunds/s", file=sys.stderr)
    table = markdown(runs)
    print(table)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"workers-{started:%Y%m%dT%H%M%SZ}.json"
        meta = {
            "started_at": started.isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.time() - started.timestamp(), 1),
        }
        path.write_text(json.dumps({"meta": meta, "args": vars(args), "runs": runs}, indent=2))
        print(f"\nwritten to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
