"""Section 3: refunds parked for approval in one worker (Postgres), reached the product's way.

For each N: a worker process (``benchmarks.parked_worker``: the product runtime and its queue worker,
with the product's queue settings) and N refunds that need approval, enqueued on the ``refunds``
queue by ``submit_refund`` as ``POST /refunds`` does, as fast as this process can submit them. The
time from the first submit to all N waiting in ``recv`` is the time to park; RSS (psutil) is read
before the first submit and after the last refund parked. An auto-approved refund submitted then
shows whether the parked refunds leave the queue free. SIGKILL, and a new worker with the same
executor id: DBOS re-enqueues the N workflows on their queue, the worker replays each one's recorded
steps and it waits on ``recv`` again; the time from the kill to all N waiting is measured, and an
auto-approved refund submitted as soon as the new worker is up shows how long new work waits behind
the recovery. Then K of the parked refunds are approved through the product's approval path
(``approvals.decide_pending``: record the decision, ``send``) at a steady rate, and the latency from
the approval call to the workflow's SUCCESS (its ``updated_at`` in ``workflow_status``, same host
clock) is taken.

The floor runs the same experiment with ``bench_floor_workflow``: the same queue, settings and approval
wait, after 0 no-op steps (what DBOS costs for a workflow that only waits) and after as many no-op steps
as a parked refund has recorded operations (what DBOS's replay of that many checkpoints costs).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

from agent import approvals, runtime
from agent.domain import RefundRequest
from agent.processes import stop
from agent.runtime import REFUND_QUEUE
from agent.settings import Settings
from agent.submit import submit_refund
from benchmarks import harness
from benchmarks.harness import APPROVAL_AMOUNT, AUTO_AMOUNT, Databases
from benchmarks.http_load import percentile
from benchmarks.parked_worker import FLOOR_WORKFLOW
from steps.store import close_app_database, create_engine, open_app_database


class Worker:
    """A child process and the ``parked``/``ready`` lines it prints."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, prefix: Sequence[str] = ()) -> None:
        """``prefix`` runs the worker under another program (a sampling profiler), which must pass its output on."""
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", *args], env=env, stdout=subprocess.PIPE, stderr=log.open("ab"), text=True
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

    def threads(self) -> int:
        return int(psutil.Process(self.proc.pid).num_threads())

    def kill(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        t = time.time()
        self.proc.wait()
        return t

    def stop(self) -> None:
        stop(self.proc, 20)

    def interrupt(self) -> None:
        """Ctrl-C the Python processes under this one (a profiler writes its samples once they exit)."""
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            child.send_signal(signal.SIGINT)
        self.proc.wait(120)


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


@dataclass(frozen=True)
class Load:
    """What a run parks: refunds that need approval, or the floor workflow after ``floor_steps`` steps."""

    label: str
    floor_steps: int | None = None

    @property
    def refunds(self) -> bool:
        return self.floor_steps is None


PRODUCT = Load("refund_workflow (product)")


def _pauses(worker: Worker, start: float, end: float) -> dict[str, Any]:
    """The worker's full garbage collections between two unix times: how many, the longest, their sum."""
    pauses = [ms for t, ms in worker.full_gcs if start <= t <= end]
    return {"count": len(pauses), "max_ms": max(pauses, default=0.0), "total_s": sum(pauses) / 1000}


def _query(system_url: str, statement: str, **params: Any) -> list[Any]:
    engine = create_engine(system_url)
    try:
        with engine.connect() as conn:
            query = sa.text(statement)
            if "ids" in params:
                query = query.bindparams(sa.bindparam("ids", expanding=True))
            return list(conn.execute(query, params))
    finally:
        engine.dispose()


def _completion_times(system_url: str, ids: list[str]) -> dict[str, float]:
    rows = _query(
        system_url,
        "SELECT workflow_uuid, updated_at FROM dbos.workflow_status WHERE status = 'SUCCESS' AND workflow_uuid IN :ids",
        ids=ids,
    )
    return {r.workflow_uuid: r.updated_at / 1000 for r in rows}


def _await_completions(system_url: str, ids: list[str], timeout: float, interval: float) -> dict[str, float]:
    """When each of ``ids`` ended (unix time), polling until all have or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    done = _completion_times(system_url, ids)
    while len(done) < len(ids) and time.monotonic() < deadline:
        time.sleep(interval)
        done = _completion_times(system_url, ids)
    return done


def _parked_ids(system_url: str) -> list[str]:
    statement = "SELECT workflow_uuid FROM dbos.workflow_status WHERE status = 'PENDING' ORDER BY created_at"
    rows = _query(system_url, statement)
    return [r.workflow_uuid for r in rows]


def _operations_before_wait(system_url: str) -> float | None:
    """Median recorded operations (operation_outputs rows) of the workflows waiting now."""
    rows = _query(
        system_url,
        "SELECT count(o.function_id) AS n FROM dbos.workflow_status w "
        "LEFT JOIN dbos.operation_outputs o ON o.workflow_uuid = w.workflow_uuid "
        "WHERE w.status = 'PENDING' GROUP BY w.workflow_uuid",
    )
    return statistics.median(r.n for r in rows) if rows else None


@contextmanager
def _client(settings: Settings) -> Iterator[Any]:
    open_app_database(settings.app_database_url)
    client = runtime.client(settings)
    try:
        yield client
    finally:
        client.destroy()
        close_app_database()


def _submitter(client: Any, settings: Settings, load: Load, n: int, tag: str) -> Callable[[int], str]:
    def submit_one(i: int) -> str:
        key = f"{tag}-{i:06d}"
        if load.refunds:
            _submit(client, key, APPROVAL_AMOUNT, settings, order=harness.BENCH_ORDERS[i % len(harness.BENCH_ORDERS)])
        else:
            options = {
                "queue_name": REFUND_QUEUE,
                "workflow_name": FLOOR_WORKFLOW,
                "workflow_id": key,
                "app_version": settings.refund_agent_app_version,
            }
            client.enqueue(options, load.floor_steps)
        return key

    return submit_one


def _auto_refund(client: Any, settings: Settings, system_url: str, key: str, timeout: float) -> float | None:
    """Submit one auto-approved refund now; seconds until its workflow ended, or None if it did not."""
    sent = time.time()
    _submit(client, key, AUTO_AMOUNT, settings)
    done = _await_completions(system_url, [key], timeout, interval=0.2)
    return done[key] - sent if key in done else None


def run_one(
    n: int,
    *,
    load: Load = PRODUCT,
    approvals_k: int,
    approval_rate: float,
    server: str,
    sandbox_url: str,
    workdir: Path,
    timeout: float,
    queue_env: dict[str, str] | None = None,
    probes: bool = True,
    recover_prefix: Sequence[str] = (),
) -> dict[str, Any]:
    """Park ``n``, SIGKILL, re-park; for refunds also probe the queue and time ``approvals_k`` approvals.

    With ``recover_prefix`` the recovering worker runs under that program, and is interrupted once all
    ``n`` wait again."""
    out: dict[str, Any] = {"parked": n, "load": load.label}
    limit = max(timeout, 0.5 * n)  # seconds for parking, and again for re-parking
    with harness.databases("postgres", server, workdir) as dbs:
        env = _env(dbs, sandbox_url, workdir, "bench-parked", **(queue_env or {}))
        log = workdir / f"parked-{n}.log"
        settings = Settings(
            refund_agent_data_dir=workdir / "data", dbos_system_database_url=dbs.system_url, database_url=dbs.app_url
        )
        worker = Worker(["benchmarks.parked_worker"], env, log)
        try:
            worker.wait("the worker to launch", lambda: worker.ready_at is not None, 120)
            with _client(settings) as client:
                submit_one = _submitter(client, settings, load, n, f"parked-{n}")
                submit_one(0)  # the first one pays the client's warm-up, outside the memory reading
                worker.wait("the first one to park", lambda: worker.parked >= 1, 120)
                time.sleep(1.0)
                rss0 = worker.rss()
                t0 = time.time()
                submitted: dict[str, float] = {}

                def submit_rest() -> None:
                    for i in range(1, n):
                        submit_one(i)
                    submitted["at"] = time.time()

                thread = threading.Thread(target=submit_rest, daemon=True)
                thread.start()
                worker.wait(f"{n} to park", lambda: worker.parked >= n, limit)
                thread.join()
                out["park_s"] = worker.parked_at - t0
                out["submit_s"] = submitted["at"] - t0
                time.sleep(1.0)
                rss1 = worker.rss()
                out.update(
                    rss_before_mb=rss0 / 2**20,
                    rss_after_mb=rss1 / 2**20,
                    rss_per_parked_kb=(rss1 - rss0) / (n - 1) / 1024,
                    threads_parked=worker.threads(),
                    operations_before_wait=_operations_before_wait(dbs.system_url),
                    full_gc_parking=_pauses(worker, t0, worker.parked_at),
                )
                if load.refunds and probes:
                    out["auto_refund_while_parked_s"] = _auto_refund(
                        client, settings, dbs.system_url, f"parked-{n}-auto-while-parked", 120
                    )
                killed = worker.kill()
                worker = Worker(["benchmarks.parked_worker"], env, log, prefix=recover_prefix)
                worker.wait("the new worker to launch", lambda: worker.ready_at is not None, 120)
                after_restart: dict[str, float | None] = {}
                if load.refunds and probes:
                    key = f"parked-{n}-auto-after-restart"

                    def probe_after_restart() -> None:
                        after_restart["s"] = _auto_refund(client, settings, dbs.system_url, key, limit)

                    probe = threading.Thread(target=probe_after_restart, daemon=True)
                    probe.start()
                worker.wait(f"{n} to park again", lambda: worker.parked >= n, limit)
                assert worker.ready_at is not None
                out["restart_to_ready_s"] = worker.ready_at - killed
                out["kill_to_all_parked_s"] = worker.parked_at - killed
                out["full_gc_recovery"] = _pauses(worker, killed, worker.parked_at)
                if recover_prefix:
                    worker.interrupt()
                    return out
                time.sleep(1.0)
                out["rss_after_recovery_mb"] = worker.rss() / 2**20
                out["threads_after_recovery"] = worker.threads()
                if load.refunds and probes:
                    probe.join()
                    out["auto_refund_after_restart_s"] = after_restart.get("s")
                if load.refunds and approvals_k:
                    out.update(_approve(client, dbs.system_url, worker, approvals_k, approval_rate))
        finally:
            worker.stop()
    return out


def _approve(client: Any, system_url: str, worker: Worker, k: int, rate: float) -> dict[str, Any]:
    ids = _parked_ids(system_url)[:k]
    sent: dict[str, float] = {}
    for refund_id in ids:
        sent[refund_id] = time.time()
        approvals.decide_pending(client, refund_id=refund_id, decision="approve", approver="bench")
        time.sleep(max(0.0, 1 / rate - (time.time() - sent[refund_id])))
    done = _await_completions(system_url, ids, 120, interval=0.5)
    latencies = [done[i] - sent[i] for i in ids if i in done]
    return {
        "full_gc_approvals": _pauses(worker, min(sent.values(), default=0), max(done.values(), default=0)),
        "approved": len(ids),
        "completed": len(latencies),
        "approval_rate_per_s": rate,
        "approve_to_completed_p50_ms": (percentile(latencies, 50) or 0) * 1000,
        "approve_to_completed_p99_ms": (percentile(latencies, 99) or 0) * 1000,
        "approve_to_completed_max_ms": max(latencies, default=0) * 1000,
    }


def _submit(client: Any, key: str, amount: Any, settings: Settings, order: str = harness.BENCH_ORDERS[0]) -> str:
    request = RefundRequest(order_id=order, message="Please refund.", amount=amount, currency="USD")
    submit_refund(client, idempotency_key=key, request=request, app_version=settings.refund_agent_app_version)
    return key


#: The queue's polling interval, the product's against the one before it, on the same recovery.
POLLING_ARMS: tuple[tuple[str, dict[str, str]], ...] = (
    ("0.1 s (product)", {}),
    ("0.5 s (earlier default)", {"QUEUE_POLLING_INTERVAL_SECONDS": "0.5"}),
)


def polling_knob(*, n: int, rounds: int, **common: Any) -> dict[str, Any]:
    """Park ``n`` refunds and re-park them after SIGKILL under each polling interval, arms alternating by round."""
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in POLLING_ARMS}
    for r in range(rounds):
        for label, env in POLLING_ARMS if r % 2 == 0 else tuple(reversed(POLLING_ARMS)):
            print(f"  parked approvals: polling interval {label}, round {r + 1}", flush=True)
            run = run_one(n, approvals_k=0, approval_rate=1, queue_env=env, probes=False, **common)
            samples[label].append({k: run[k] for k in ("park_s", "kill_to_all_parked_s")})
    medians = {
        label: {k: harness.median([s[k] for s in runs]) for k in ("park_s", "kill_to_all_parked_s")}
        for label, runs in samples.items()
    }
    arms = [label for label, _ in POLLING_ARMS]
    return {"parked": n, "rounds": rounds, "arms": arms, "medians": medians, "samples": samples}


def run_section(
    *,
    counts: list[int],
    floor: list[int],
    polling_n: int,
    polling_rounds: int,
    approvals_k: int,
    approval_rate: float,
    server: str,
    sandbox_url: str,
    workdir: Path,
    timeout: float,
) -> dict[str, Any]:
    common: dict[str, Any] = {"server": server, "sandbox_url": sandbox_url, "workdir": workdir, "timeout": timeout}
    results: list[dict[str, Any]] = []

    def attempt(n: int, load: Load, **kwargs: Any) -> dict[str, Any]:
        print(f"  parked approvals: N={n}, {load.label}", flush=True)
        try:
            run = run_one(n, load=load, approval_rate=approval_rate, **kwargs, **common)
        except (TimeoutError, RuntimeError) as error:
            run = {"parked": n, "load": load.label, "error": str(error)}
        results.append(run)
        return run

    for n in counts:
        product = attempt(n, PRODUCT, approvals_k=min(approvals_k, n))
        if n in floor:
            # as many checkpoints as the refund: its recorded operations include the wait's own timer
            steps = max(round(product.get("operations_before_wait") or 1) - 1, 0)
            attempt(n, Load("floor: wait only", 0), approvals_k=0)
            attempt(n, Load(f"floor: {steps} no-op steps, then wait", steps), approvals_k=0)
    out: dict[str, Any] = {"runs": results}
    if polling_rounds:
        out["polling"] = polling_knob(n=polling_n, rounds=polling_rounds, **common)
    return out
