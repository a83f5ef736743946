"""What the parked-approval runs share: the worker process, the run's databases read with SQL, submitting.

Times come from one host clock: the benchmark's ``time.time()`` when it submits or decides, and DBOS's
``workflow_status`` timestamps (``started_at_epoch_ms`` when a worker dequeued a workflow, ``updated_at``
when it ended) for when work started and finished. A handle's ``get_result`` polls about once a second,
so nothing here is timed through it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import psycopg
import sqlalchemy as sa
from dbos import DBOSClient

from agent.domain import RefundRequest
from agent.ops.processes import stop
from agent.submit import submit_refund
from benchmarks import harness
from benchmarks.harness import Databases
from benchmarks.http_load import percentile
from benchmarks.identities import BENCH_REQUESTER
from benchmarks.limits import SERIAL_RULE_OFF_ENV
from steps.store import create_engine, utc

EXECUTOR = "bench-parked"  # every worker of a run has this id: a restart is the same executor
WAKE_WORKFLOW = "bench_wake_workflow"  # registered by the worker (benchmarks.parked_worker)
TERMINAL = ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")
#: A claim on a shipped benchmark order that the carrier shows delivered with a photo: policy asks the customer.
ASK_MESSAGE = "My parcel never arrived."
ASK_AMOUNT = Decimal("42.00")  # under the auto-approve limit: the evidence, not the amount, decides


class Worker:
    """``benchmarks.parked_worker`` as a child process, and the lines it prints."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.spawned_at = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.parked_worker"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("ab"),
            text=True,
        )
        self.ready_at: float | None = None
        self.full_gcs: list[tuple[float, float]] = []  # (unix time at the end, pause ms)
        self.decided: dict[str, tuple[float, float, str]] = {}  # refund id -> (called, returned, outcome)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "ready":
                self.ready_at = float(parts[1])
            elif len(parts) == 3 and parts[0] == "gc2":
                self.full_gcs.append((float(parts[2]), float(parts[1])))
            elif len(parts) == 5 and parts[0] == "decided":
                self.decided[parts[1]] = (float(parts[2]), float(parts[3]), parts[4])

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.proc.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 120) -> float:
        self.wait("the worker to start", lambda: self.ready_at is not None, timeout)
        assert self.ready_at is not None
        return self.ready_at

    def decide(self, refund_id: str) -> None:
        """Approve ``refund_id`` inside the worker, through the product's decision path."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"decide {refund_id}\n")
        self.proc.stdin.flush()

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def rss_mb(self) -> float:
        return float(psutil.Process(self.proc.pid).memory_info().rss) / 2**20

    def threads(self) -> int:
        return int(psutil.Process(self.proc.pid).num_threads())

    def pauses(self, start: float, end: float) -> dict[str, Any]:
        """Full garbage collections between two unix times: how many and the longest (ms)."""
        found = [ms for t, ms in self.full_gcs if start <= t <= end]
        return {"count": len(found), "max_ms": max(found, default=0.0)}

    def kill(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        self.proc.wait()
        return killed

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stop(self.proc, 20)


def worker_env(dbs: Databases, sandbox_url: str, workdir: Path, **extra: str) -> dict[str, str]:
    """The environment ``refund-agent worker`` would get; ``extra`` sets product settings by name."""
    env = {
        **os.environ,
        "REFUND_AGENT_DATA_DIR": str(workdir / "data"),
        "DBOS_SYSTEM_DATABASE_URL": dbs.system_url,
        "DATABASE_URL": dbs.app_url,
        "PAYMENTS_API_BASE": sandbox_url,
        "REFUND_AGENT_EXECUTOR_ID": EXECUTOR,
        **SERIAL_RULE_OFF_ENV,
    }
    env.update(extra)
    return env


@dataclass
class Store:
    """The run's two databases, read with SQL (DBOS's system tables for timestamps)."""

    system: sa.Engine
    app: sa.Engine

    def _rows(self, engine: sa.Engine, statement: str, ids: Sequence[str] | None = None, **params: Any) -> list[Any]:
        query = sa.text(statement)
        if ids is not None:
            query = query.bindparams(sa.bindparam("ids", expanding=True))
            params["ids"] = list(ids)
        with engine.connect() as conn:
            return list(conn.execute(query, params))

    def workflows(self, ids: Sequence[str]) -> dict[str, tuple[str, float | None, float]]:
        """workflow id -> (status, started (unix s) or None, last updated (unix s))."""
        rows = self._rows(
            self.system,
            "SELECT workflow_uuid, status, started_at_epoch_ms, updated_at FROM dbos.workflow_status "
            "WHERE workflow_uuid IN :ids",
            ids,
        )
        return {
            r.workflow_uuid: (
                r.status,
                r.started_at_epoch_ms / 1000 if r.started_at_epoch_ms else None,
                r.updated_at / 1000,
            )
            for r in rows
        }

    def statuses(self, ids: Sequence[str]) -> Counter[str]:
        return Counter(status for status, _, _ in self.workflows(ids).values())

    def count_status(self, status: str) -> int:
        rows = self._rows(self.system, "SELECT count(*) AS n FROM dbos.workflow_status WHERE status = :s", s=status)
        return int(rows[0].n)

    def refund_rows(self, ids: Sequence[str]) -> Counter[str]:
        rows = self._rows(self.app, "SELECT status FROM refunds WHERE refund_id IN :ids", ids)
        return Counter(r.status for r in rows)

    def questions(self, ids: Sequence[str] | None = None) -> Counter[str]:
        """The customer questions of these refunds (of every refund: None) by ``{question}:{state}``
        (``delivery:open``, ...)."""
        query = "SELECT question || ':' || state AS kind, count(*) AS n FROM customer_questions"
        if ids is None:
            rows = self._rows(self.app, query + " GROUP BY question, state")
        else:
            rows = self._rows(self.app, query + " WHERE refund_id IN :ids GROUP BY question, state", ids)
        return Counter({r.kind: r.n for r in rows})

    def all_refund_rows(self) -> Counter[str]:
        return Counter(
            {r.status: r.n for r in self._rows(self.app, "SELECT status, count(*) AS n FROM refunds GROUP BY status")}
        )

    def decisions(self, ids: Sequence[str]) -> Counter[str]:
        rows = self._rows(self.app, "SELECT decision FROM approval_decisions WHERE refund_id IN :ids", ids)
        return Counter(r.decision for r in rows)

    def deadlines(self, ids: Sequence[str]) -> tuple[float, float]:
        """The earliest and latest approval deadline (unix s) of these refunds."""
        row = self._rows(
            self.app,
            "SELECT min(expires_at) AS lo, max(expires_at) AS hi FROM approval_requests WHERE refund_id IN :ids",
            ids,
        )[0]
        return _unix(row.lo), _unix(row.hi)

    def oldest_parked(self, prefix: str, k: int) -> list[str]:
        """Up to ``k`` refunds whose id starts with ``prefix`` waiting for a decision, oldest first."""
        rows = self._rows(
            self.app,
            "SELECT r.refund_id FROM approval_requests r LEFT JOIN approval_decisions d ON d.refund_id = r.refund_id "
            "WHERE d.refund_id IS NULL AND r.refund_id LIKE :p ORDER BY r.requested_at, r.refund_id LIMIT :k",
            p=f"{prefix}%",
            k=k,
        )
        return [r.refund_id for r in rows]


def _unix(value: Any) -> float:
    return float(utc(value).timestamp())


@contextmanager
def opened(dbs: Databases, workdir: Path) -> Iterator[tuple[Store, DBOSClient]]:
    """SQL access to the run's databases and a DBOS client (the app database opened as the API opens it)."""
    with harness.submitting(workdir / "data", dbs.system_url, dbs.app_url) as (_, client):
        store = Store(create_engine(dbs.system_url), create_engine(dbs.app_url))
        try:
            yield store, client
        finally:
            store.system.dispose()
            store.app.dispose()


def submit(client: DBOSClient, key: str, amount: Decimal, i: int = 0, *, ask: bool = False) -> float:
    """Submit one refund the product's way (``POST /refunds`` calls ``submit_refund``); when it was sent.
    ``ask``: the claim that the parcel never came, on a shipped order (its customer is asked to confirm)."""
    orders = harness.SHIPPED_ORDERS if ask else harness.BENCH_ORDERS
    message = ASK_MESSAGE if ask else "Please refund."
    request = RefundRequest(order_id=orders[i % len(orders)], message=message, amount=amount, currency="USD")
    sent = time.time()
    submit_refund(client, idempotency_key=key, request=request, requester=BENCH_REQUESTER)
    return sent


def await_ended(store: Store, ids: Sequence[str], timeout: float, interval: float = 0.25) -> dict[str, float]:
    """When each of ``ids`` ended (unix s), polling until all have or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        found = store.workflows(ids)
        ended = {i: updated for i, (status, _, updated) in found.items() if status in TERMINAL}
        if len(ended) == len(ids) or time.monotonic() > deadline:
            return ended
        time.sleep(interval)


def latency_summary(values: Sequence[float], *, scale: float = 1.0) -> dict[str, Any]:
    """Count, median, p99 and max of ``values`` times ``scale`` (1000 for seconds -> ms)."""
    return {
        "n": len(values),
        "p50": _scaled(percentile(values, 50), scale),
        "p99": _scaled(percentile(values, 99), scale),
        "max": _scaled(max(values, default=None), scale),
    }


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def probe_auto(client: DBOSClient, store: Store, key: str, timeout: float = 120) -> float | None:
    """Submit one auto-approved refund now; seconds until its workflow ended, or None if it did not."""
    sent = submit(client, key, harness.AUTO_AMOUNT)
    ended = await_ended(store, [key], timeout, interval=0.05)
    return ended[key] - sent if key in ended else None


def _postgres_backends(server: str, dbs: Databases) -> list[psutil.Process]:
    with psycopg.connect(harness.admin_url(server), autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)", (dbs.pg_names,)).fetchall()
    found = []
    for (pid,) in rows:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _cpu(processes: Sequence[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in processes:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:  # a backend that went away
            continue
    return out


def idle_sample(worker: Worker, server: str, dbs: Databases, seconds: float) -> dict[str, Any]:
    """With nothing to do: the CPU of the worker and of the run's Postgres backends over ``seconds``, the RSS."""
    time.sleep(min(3.0, seconds))  # the probe's connections and the new process settle
    backends = _postgres_backends(server, dbs)
    w0, b0, t0 = worker.cpu_seconds(), _cpu(backends), time.monotonic()
    time.sleep(seconds)
    w1, b1, t1 = worker.cpu_seconds(), _cpu(backends), time.monotonic()
    return {
        "idle_s": t1 - t0,
        "worker_cpu_pct": (w1 - w0) / (t1 - t0) * 100,
        "postgres_cpu_pct": sum(b1[pid] - b0[pid] for pid in b1 if pid in b0) / (t1 - t0) * 100,
        "postgres_backends": len(backends),
        "rss_mb": worker.rss_mb(),
        "threads": worker.threads(),
    }
