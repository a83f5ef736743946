"""Section 3: refunds parked for approval in one worker (Postgres).

For each N: a worker process (``benchmarks.parked_worker``) starts N refunds that need approval and
parks them on ``recv``; RSS is read (psutil) before the first and after the last one parked. The worker
is SIGKILLed and started again with the same executor id: DBOS recovers the N workflows, each replays its
recorded steps and waits on ``recv`` again; the time from the kill to all N waiting is measured. Then K
of them are approved through the product's approval path (``approvals.decide_pending``: record the
decision, ``send``) at a steady rate, and the latency from the approval call to the workflow's SUCCESS
(its ``updated_at`` in ``workflow_status``, same host clock) is taken.

A second, small experiment checks whether parked refunds hold the ``refunds`` queue's concurrency:
refunds submitted the product's way (queue, ``refund-agent worker`` with its default concurrency) that
wait for approval, then one auto-approved refund behind them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

from agent import approvals, runtime
from agent.processes import stop
from agent.settings import Settings
from agent.status import refund_status
from agent.submit import submit_refund
from benchmarks import harness
from benchmarks.harness import APPROVAL_AMOUNT, AUTO_AMOUNT, Databases
from benchmarks.http_load import percentile
from steps.store import close_app_database, create_engine, open_app_database


class Worker:
    """A child process and the ``parked``/``ready`` lines it prints."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], env=env, stdout=subprocess.PIPE, stderr=log.open("ab"), text=True
        )
        self.parked = 0
        self.parked_at = 0.0
        self.ready_at: float | None = None
        self.started_at: float | None = None
        self.full_gcs: list[tuple[float, float]] = []  # (unix time at the end, pause ms)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "parked":
                self.parked, self.parked_at = int(parts[1]), float(parts[2])
            elif len(parts) == 2 and parts[0] == "ready":
                self.ready_at = float(parts[1])
            elif len(parts) == 3 and parts[0] == "gc2":
                self.full_gcs.append((float(parts[2]), float(parts[1])))
            elif len(parts) == 3 and parts[0] == "started":
                self.started_at = float(parts[2])

    def wait(self, what: str, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.proc.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (parked {self.parked})")
            time.sleep(0.05)

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def kill(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        t = time.time()
        self.proc.wait()
        return t

    def stop(self) -> None:
        stop(self.proc, 20)


def _env(dbs: Databases, sandbox_url: str, workdir: Path, executor: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "REFUND_AGENT_DATA_DIR": str(workdir / "data"),
        "DBOS_SYSTEM_DATABASE_URL": dbs.system_url,
        "DATABASE_URL": dbs.app_url,
        "PAYMENTS_API_BASE": sandbox_url,
        "REFUND_AGENT_EXECUTOR_ID": executor,
    }
    env.update(extra)
    return env


def _pauses(worker: Worker, start: float, end: float) -> dict[str, Any]:
    """The worker's full garbage collections between two unix times: how many, the longest, their sum."""
    pauses = [ms for t, ms in worker.full_gcs if start <= t <= end]
    return {"count": len(pauses), "max_ms": max(pauses, default=0.0), "total_s": sum(pauses) / 1000}


def _completion_times(system_url: str, ids: list[str]) -> dict[str, float]:
    engine = create_engine(system_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT workflow_uuid, updated_at FROM dbos.workflow_status "
                    "WHERE status = 'SUCCESS' AND workflow_uuid IN :ids"
                ).bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": ids},
            )
            return {r.workflow_uuid: r.updated_at / 1000 for r in rows}
    finally:
        engine.dispose()


def _parked_ids(system_url: str) -> list[str]:
    engine = create_engine(system_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT workflow_uuid FROM dbos.workflow_status WHERE status = 'PENDING' ORDER BY created_at")
            )
            return [r.workflow_uuid for r in rows]
    finally:
        engine.dispose()


@contextmanager
def _client(settings: Settings) -> Iterator[Any]:
    open_app_database(settings.app_database_url)
    client = runtime.client(settings)
    try:
        yield client
    finally:
        client.destroy()
        close_app_database()


def run_one(
    n: int, *, approvals_k: int, approval_rate: float, server: str, sandbox_url: str, workdir: Path, timeout: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"parked": n}
    with harness.databases("postgres", server, workdir) as dbs:
        env = _env(dbs, sandbox_url, workdir, "bench-parked")
        log = workdir / f"parked-{n}.log"
        worker = Worker(["benchmarks.parked_worker", "start", str(n)], env, log)
        try:
            worker.wait("the worker to launch", lambda: worker.ready_at is not None, 120)
            time.sleep(1.0)
            rss0 = worker.rss()
            t0 = time.time()
            worker.wait(f"{n} refunds to park", lambda: worker.parked >= n, timeout)
            out["park_s"] = worker.parked_at - t0
            time.sleep(1.0)
            rss1 = worker.rss()
            out.update(
                rss_before_mb=rss0 / 2**20, rss_after_mb=rss1 / 2**20, rss_per_parked_kb=(rss1 - rss0) / n / 1024
            )
            out["full_gc_parking"] = _pauses(worker, t0, worker.parked_at)
            killed = worker.kill()
            worker = Worker(["benchmarks.parked_worker", "recover"], env, log)
            worker.wait(f"{n} refunds to park again", lambda: worker.parked >= n, timeout)
            assert worker.ready_at is not None
            out["restart_to_ready_s"] = worker.ready_at - killed
            out["kill_to_all_parked_s"] = worker.parked_at - killed
            out["full_gc_recovery"] = _pauses(worker, killed, worker.parked_at)
            time.sleep(1.0)
            out["rss_after_recovery_mb"] = worker.rss() / 2**20
            settings = Settings(
                refund_agent_data_dir=workdir / "data",
                dbos_system_database_url=dbs.system_url,
                database_url=dbs.app_url,
            )
            ids = _parked_ids(dbs.system_url)[:approvals_k]
            sent: dict[str, float] = {}
            with _client(settings) as client:
                for refund_id in ids:
                    sent[refund_id] = time.time()
                    approvals.decide_pending(client, refund_id=refund_id, decision="approve", approver="bench")
                    time.sleep(max(0.0, 1 / approval_rate - (time.time() - sent[refund_id])))
            deadline = time.monotonic() + 120
            done: dict[str, float] = {}
            while time.monotonic() < deadline and len(done) < len(ids):
                done = _completion_times(dbs.system_url, ids)
                time.sleep(0.5)
            latencies = [done[i] - sent[i] for i in ids if i in done]
            out["full_gc_approvals"] = _pauses(worker, min(sent.values(), default=0), max(done.values(), default=0))
            out.update(
                approved=len(ids),
                completed=len(latencies),
                approval_rate_per_s=approval_rate,
                approve_to_completed_p50_ms=(percentile(latencies, 50) or 0) * 1000,
                approve_to_completed_p99_ms=(percentile(latencies, 99) or 0) * 1000,
                approve_to_completed_max_ms=max(latencies, default=0) * 1000,
            )
        finally:
            worker.stop()
    return out


def queue_experiment(*, server: str, sandbox_url: str, workdir: Path, parked: int = 6) -> dict[str, Any]:
    """Do refunds waiting for approval hold the queue's worker concurrency (4 by default)?"""
    with harness.databases("postgres", server, workdir) as dbs:
        env = _env(dbs, sandbox_url, workdir, "bench-queue", QUEUE_POLLING_INTERVAL_SECONDS="0.1")
        settings = Settings(
            refund_agent_data_dir=workdir / "data",
            dbos_system_database_url=dbs.system_url,
            database_url=dbs.app_url,
        )
        log = workdir / "queue-worker.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "worker"], env=env, stdout=out, stderr=out)
        try:
            with _client(settings) as client:
                from steps.seed import seed
                from steps.store import app_db

                deadline = time.monotonic() + 120
                while True:  # the worker migrates the databases; seed once it has
                    try:
                        seed(app_db().engine)
                        harness._seed_bench_orders(app_db().engine)
                        break
                    except sa.exc.SQLAlchemyError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
                keys = []
                for i in range(parked):
                    keys.append(_submit(client, f"queue-park-{i}", APPROVAL_AMOUNT, settings))
                auto = _submit(client, "queue-auto", AUTO_AMOUNT, settings)
                t0 = time.monotonic()
                phases: dict[str, Any] = {}
                while time.monotonic() - t0 < 30:
                    phases = {k: _phase(client, k) for k in [*keys, auto]}
                    if phases[auto] == "completed":
                        break
                    time.sleep(0.5)
                waited = time.monotonic() - t0
                awaiting = sum(1 for k in keys if phases.get(k) == "awaiting_approval")
                return {
                    "worker_concurrency": 4,
                    "submitted_needing_approval": parked,
                    "parked_within_30s": awaiting,
                    "auto_refund_phase_after_wait": phases.get(auto),
                    "waited_s": round(waited, 1),
                }
        finally:
            stop(proc, 20)


def _phase(client: Any, refund_id: str) -> str | None:
    """The phase callers see (``GET /refunds/{id}``): the refund's row, its workflow and its events."""
    status = refund_status(client, refund_id)
    return str(status["status"]) if status else None


def _submit(client: Any, key: str, amount: Any, settings: Settings) -> str:
    from agent.domain import RefundRequest

    request = RefundRequest(order_id=harness.BENCH_ORDERS[0], message="Please refund.", amount=amount, currency="USD")
    submit_refund(client, idempotency_key=key, request=request, app_version=settings.refund_agent_app_version)
    return key


def run_section(
    *,
    counts: list[int],
    approvals_k: int,
    approval_rate: float,
    server: str,
    sandbox_url: str,
    workdir: Path,
    timeout: float,
) -> dict[str, Any]:
    results = []
    for n in counts:
        print(f"  parked approvals: N={n}", flush=True)
        try:
            results.append(
                run_one(
                    n,
                    approvals_k=min(approvals_k, n),
                    approval_rate=approval_rate,
                    server=server,
                    sandbox_url=sandbox_url,
                    workdir=workdir,
                    timeout=timeout,
                )
            )
        except (TimeoutError, RuntimeError) as error:
            results.append({"parked": n, "error": str(error)})
    print("  parked approvals: queue experiment", flush=True)
    queue = queue_experiment(server=server, sandbox_url=sandbox_url, workdir=workdir)
    return {"runs": results, "queue": queue}
