"""Executor leases: one live process per executor id, heartbeats, and recovery of dead executors' refunds.

Every process that launches DBOS holds a lease row on its executor id in the application database and
renews it every few seconds. A second process that asks for an id whose lease is fresh and held by a
process that is still alive is refused (two processes with one executor id would run the same steps).
Every process also sweeps the table: an executor whose lease went stale (killed, OOM, machine gone) or
that stopped for good has its PENDING workflows handed back to their queue with ``DBOS.resume_workflow``
(a public call: it re-enqueues a workflow that has not finished and clears its owner), where any live
worker dequeues them. A workflow that was started directly, not from a queue (a decision taken in an API
process), goes to the fallback queue.

Two survivors racing for the same dead executor are safe: the sweep first takes the dead executor's
lease with a compare-and-set on its token (one sweeper wins, and only it lists and resumes the dead
executor's workflows), and a single ENQUEUED -> PENDING dequeue then hands each to exactly one worker.
The dead process cannot be running any of them: its lease is stale, or it released it when it stopped.
Times are the database's clock, so hosts with skewed clocks agree.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from dbos import DBOS

from steps.store import db_now_ms, executor_leases

log = logging.getLogger(__name__)

RUNNING, STOPPED, RECOVERING, RECOVERED = "running", "stopped", "recovering", "recovered"
MAX_EXECUTOR_INDEX = 64


def lease_engine(app_database_url: str) -> sa.Engine:
    """A small engine of its own, so leases are renewed even when the app's pool is busy."""
    from steps.store import create_engine, normalize_url

    if normalize_url(app_database_url).startswith("sqlite"):
        return create_engine(app_database_url)
    return create_engine(app_database_url, pool_size=2, max_overflow=0)


class ExecutorIdInUse(RuntimeError):
    """Another live process holds the executor id's lease."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class Lease:
    executor_id: str
    token: str
    host: str
    pid: int
    app_version: str
    role: str


def _holder_is_gone(row: Any, *, now: int, stale_after_ms: int, host: str, pid: int) -> bool:
    if row.state in (STOPPED, RECOVERED) or now - row.beat_ms > stale_after_ms:
        return True
    # On this host the holder's liveness is known for sure: a dead pid (or our own, from a previous
    # life in a fresh pid namespace) cannot be running anything. This is what lets a worker that was
    # SIGKILLed come straight back under its id and recover its own work.
    return bool(row.host == host and (row.pid == pid or not pid_alive(row.pid)))


def try_claim(engine: sa.Engine, lease: Lease, *, stale_after: float) -> Any | None:
    """Take the lease on ``lease.executor_id``; None when taken, else the row of the live holder."""
    query = sa.select(executor_leases).where(executor_leases.c.executor_id == lease.executor_id)
    try:
        with engine.begin() as conn:
            now = db_now_ms(conn)
            row = conn.execute(query.with_for_update()).first()
            if row is not None and not _holder_is_gone(
                row, now=now, stale_after_ms=int(stale_after * 1000), host=lease.host, pid=lease.pid
            ):
                return row
            values = {
                "token": lease.token,
                "state": RUNNING,
                "host": lease.host,
                "pid": lease.pid,
                "app_version": lease.app_version,
                "role": lease.role,
                "started_ms": now,
                "beat_ms": now,
            }
            if row is None:
                conn.execute(sa.insert(executor_leases).values(executor_id=lease.executor_id, **values))
                return None
            done = conn.execute(
                sa.update(executor_leases)
                .where(executor_leases.c.executor_id == lease.executor_id, executor_leases.c.token == row.token)
                .values(**values)
            )
            if done.rowcount == 1:
                return None
    except sa.exc.IntegrityError:
        pass  # another process inserted the row between our read and our write
    with engine.connect() as conn:  # another process won the race: it is the holder
        return conn.execute(query).first()


def claim(
    engine: sa.Engine,
    *,
    executor_id: str | None,
    app_version: str,
    role: str,
    stale_after: float,
) -> Lease:
    """The lease on ``executor_id``, or (when it is None) on the first free ``<hostname>-<index>``."""
    host = socket.gethostname()
    candidates = [executor_id] if executor_id else [f"{host}-{i}" for i in range(MAX_EXECUTOR_INDEX)]
    holder: Any = None
    for candidate in candidates:
        lease = Lease(candidate, secrets.token_hex(16), host, os.getpid(), app_version, role)
        holder = try_claim(engine, lease, stale_after=stale_after)
        if holder is None:
            return lease
    assert holder is not None
    raise ExecutorIdInUse(
        f"executor id {candidates[-1]!r} is in use by pid {holder.pid} on {holder.host} (role {holder.role}, "
        f"lease renewed within the last {stale_after:.0f}s); give every process its own REFUND_AGENT_EXECUTOR_ID, "
        "or wait for the other process to stop"
    )


def release(engine: sa.Engine, lease: Lease) -> None:
    """Mark the lease stopped: survivors recover anything left PENDING under the id, or a restart reclaims it."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(executor_leases)
            .where(executor_leases.c.executor_id == lease.executor_id, executor_leases.c.token == lease.token)
            .values(state=STOPPED, beat_ms=db_now_ms(conn))
        )


def release_quietly(engine: sa.Engine, lease: Lease) -> bool:
    """``release``, tried again once (a first failure on a cut connection resets the pool); False if it failed.

    A stopping process must stop even when the database is away: an unreleased lease goes stale, and
    survivors or a restart take the id over then."""
    for attempt in (1, 2):
        try:
            release(engine, lease)
            return True
        except sa.exc.SQLAlchemyError as error:
            if attempt == 2:
                log.warning("executor %s: lease not released (%s)", lease.executor_id, type(error).__name__)
    return False


def renew(engine: sa.Engine, lease: Lease) -> bool:
    """Renew the lease; False when someone else holds it now (we were declared dead)."""
    with engine.begin() as conn:
        done = conn.execute(
            sa.update(executor_leases)
            .where(
                executor_leases.c.executor_id == lease.executor_id,
                executor_leases.c.token == lease.token,
                executor_leases.c.state == RUNNING,
            )
            .values(beat_ms=db_now_ms(conn))
        )
    return done.rowcount == 1


def claim_dead(engine: sa.Engine, lease: Lease, *, stale_after: float) -> list[tuple[str, int]]:
    """Take over the leases of executors (same app version) that stopped or went stale; ids and age (ms)."""
    taken: list[tuple[str, int]] = []
    with engine.begin() as conn:
        now = db_now_ms(conn)
        t = executor_leases.c
        rows = conn.execute(
            sa.select(executor_leases).where(
                t.executor_id != lease.executor_id,
                t.app_version == lease.app_version,
                sa.or_(
                    t.state == STOPPED,
                    sa.and_(t.state.in_((RUNNING, RECOVERING)), t.beat_ms < now - int(stale_after * 1000)),
                ),
            )
        ).fetchall()
    for row in rows:
        with engine.begin() as conn:  # compare-and-set on the dead holder's token: one sweeper wins
            won = conn.execute(
                sa.update(executor_leases)
                .where(t.executor_id == row.executor_id, t.token == row.token, t.state == row.state)
                .values(state=RECOVERING, token=lease.token, host=lease.host, pid=lease.pid, beat_ms=db_now_ms(conn))
            )
        if won.rowcount == 1:
            taken.append((row.executor_id, now - row.beat_ms))
    return taken


def mark_recovered(engine: sa.Engine, lease: Lease, executor_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(executor_leases)
            .where(executor_leases.c.executor_id == executor_id, executor_leases.c.token == lease.token)
            .values(state=RECOVERED, beat_ms=db_now_ms(conn))
        )


def resume_pending(executor_id: str, *, fallback_queue: str) -> int:
    """Re-enqueue every PENDING workflow of ``executor_id`` on its own queue (or the fallback); how many."""
    pending = DBOS.list_workflows(status="PENDING", executor_id=executor_id, load_input=False, load_output=False)
    for workflow in pending:
        DBOS.resume_workflow(workflow.workflow_id, queue_name=workflow.queue_name or fallback_queue)
    return len(pending)


def recover_dead_executors(
    engine: sa.Engine, lease: Lease, *, stale_after: float, fallback_queue: str
) -> dict[str, int]:
    """Hand the PENDING workflows of dead executors back to their queues; executor id -> workflows."""
    recovered: dict[str, int] = {}
    for dead, age_ms in claim_dead(engine, lease, stale_after=stale_after):
        resumed = resume_pending(dead, fallback_queue=fallback_queue)
        mark_recovered(engine, lease, dead)
        recovered[dead] = resumed
        log.warning(
            "executor %s last renewed its lease %.1fs ago: re-enqueued its %d pending workflows",
            dead,
            age_ms / 1000,
            resumed,
        )
    return recovered


class Heartbeat:
    """Renews this process's lease and sweeps for dead executors, in one daemon thread."""

    def __init__(
        self,
        engine: sa.Engine,
        lease: Lease,
        *,
        interval: float,
        stale_after: float,
        on_lost: Callable[[], None],
        fallback_queue: str,
    ) -> None:
        self.engine, self.lease = engine, lease
        self.fallback_queue = fallback_queue
        self.interval, self.stale_after = interval, stale_after
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="executor-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not renew(self.engine, self.lease):
                    log.critical("executor %s lost its lease to another process", self.lease.executor_id)
                    self.on_lost()
                    return
                recover_dead_executors(
                    self.engine, self.lease, stale_after=self.stale_after, fallback_queue=self.fallback_queue
                )
            except Exception as error:  # a database blip: try again on the next beat
                log.warning("executor heartbeat failed: %s: %s", type(error).__name__, error)
