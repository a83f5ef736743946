"""N parked refunds whose approval deadlines are all due at once, and new refunds while they drain.

On fresh databases, one worker parks N refunds with ``APPROVAL_TIMEOUT_SECONDS`` = T, chosen to pass
only after the last one has parked, and ``APPROVAL_ESCALATE_AFTER_SECONDS`` = T, so no reminder is
scheduled. Auto-approved refunds, one a second, give the latency before. The worker is then SIGKILLed,
and once every deadline has passed a new one starts (same executor id): all N deadline workflows are
due when it starts, as after an outage, or for a batch of requests sharing one deadline. Measured: the
drain, from the new worker being ready to the end of the last deadline workflow, and auto-approved
refunds submitted one a second while it drains. Checked: every refund's row ended ``rejected`` with an
``expired`` decision, the provider's ledger holds no refund for any of them, and none is unfinished.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from dbos import DBOSClient

from agent import approvals
from agent.status import FINAL
from benchmarks import harness
from benchmarks.harness import APPROVAL_AMOUNT
from benchmarks.parked_common import Store, Worker, await_ended, latency_summary, opened, probe_auto, submit, worker_env

PROBE_INTERVAL_S = 1.0


def timeout_for(n: int, park_per_s: float | None) -> float:
    """An approval timeout that passes after ``n`` refunds have parked at ``park_per_s`` (5/s if unknown)."""
    return max(30.0, 1.3 * n / (park_per_s or 5.0) + 30.0)


def _ledger_refunds(ledger: Path, prefix: str) -> int:
    """Provider refunds in the sandbox's ledger whose metadata names a refund starting with ``prefix``."""
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sandbox_refunds WHERE json_extract(metadata_json, '$.refund_id') LIKE ?",
            (f"{prefix}%",),
        ).fetchone()
    return int(row[0])


class Prober:
    """Auto-approved refunds submitted every second on a thread until stopped."""

    def __init__(self, client: DBOSClient, tag: str) -> None:
        self.client, self.tag = client, tag
        self.sent: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"{self.tag}-{i:04d}"
            self.sent[key] = submit(self.client, key, harness.AUTO_AMOUNT, i)
            i += 1
            self._stop.wait(max(0.0, PROBE_INTERVAL_S - (time.time() - self.sent[key])))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.sent


def _park(client: DBOSClient, store: Store, keys: list[str], limit: float) -> tuple[float, float]:
    first = time.time()
    for i, key in enumerate(keys):
        submit(client, key, APPROVAL_AMOUNT, i)
    ended = await_ended(store, keys, limit, interval=2.0)
    if len(ended) < len(keys):
        raise TimeoutError(f"{len(keys) - len(ended)} of {len(keys)} refunds did not park within {limit:.0f}s")
    return first, max(ended.values())


def _before(client: DBOSClient, store: Store, n: int, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        t = time.time()
        latency = probe_auto(client, store, f"x{n}-before-{i:03d}")
        if latency is not None:
            latencies.append(latency)
        time.sleep(max(0.0, PROBE_INTERVAL_S - (time.time() - t)))
    return latencies


def run(
    n: int, *, approval_timeout: float, server: str, sandbox_url: str, workdir: Path, timeout: float, probes: int = 10
) -> dict[str, Any]:
    limit = max(timeout, 0.5 * n)
    keys = [f"x{n}-park-{i:05d}" for i in range(n)]
    deadlines = [approvals.deadline_id(k) for k in keys]
    out: dict[str, Any] = {
        "expiring": n,
        "approval_timeout_s": approval_timeout,
        "load_average_start": harness.os_load(),
    }
    with harness.databases("postgres", server, workdir) as dbs:
        t = f"{approval_timeout:.3f}"
        env = worker_env(dbs, sandbox_url, workdir, APPROVAL_TIMEOUT_SECONDS=t, APPROVAL_ESCALATE_AFTER_SECONDS=t)
        log = workdir / f"expiry-{n}.log"
        worker = Worker(env, log)
        try:
            worker.wait_ready()
            with opened(dbs, workdir) as (store, client):
                probe_auto(client, store, f"x{n}-warm-up")
                first, parked = _park(client, store, keys, limit)
                lo, hi = store.deadlines(keys)
                out.update(park_s=parked - first, first_deadline_after_parked_s=lo - parked, deadline_spread_s=hi - lo)
                out["before_ms"] = latency_summary(_before(client, store, n, probes), scale=1000)
                out["decided_before_restart"] = sum(store.decisions(keys).values())  # expiries before the moment: 0
                worker.kill()
                time.sleep(max(0.0, hi + 1.0 - time.time()))
                out["pending_at_restart"] = store.count_status("PENDING")
                worker = Worker(env, log)
                ready = worker.wait_ready()
                prober = Prober(client, f"x{n}-during")
                ended = await_ended(store, deadlines, limit, interval=1.0)
                sent = prober.stop()
                drained = max(ended.values(), default=ready)
                probe_ends = await_ended(store, list(sent), 120)
                during = {s - ready: probe_ends[k] - s for k, s in sent.items() if s <= drained and k in probe_ends}
                starts = [s for _, s, _ in store.workflows(deadlines).values() if s is not None]
                rows = store.refund_rows(keys)
                ledger = harness.sandbox_ledger(workdir, sandbox_url)
                first_start = min(starts, default=ready)
                out.update(
                    drain_s=drained - first_start,  # the approvals queue may start before runtime.start returns
                    ready_to_drained_s=drained - ready,
                    first_deadline_started_s=first_start - ready,
                    expired_per_s=len(ended) / (drained - first_start) if drained > first_start else None,
                    timeline_per_s=_per_second([e - ready for e in ended.values()]),
                    during_ms=latency_summary(list(during.values()), scale=1000),
                    during_samples=sorted(during.items()),  # (submitted, s after the restart; latency, s)
                    during_not_completed=sum(1 for k, s in sent.items() if s <= drained and k not in probe_ends),
                    deadline_workflows=dict(store.statuses(deadlines)),
                    decisions=dict(store.decisions(keys)),
                    refund_rows=dict(rows),
                    not_final=n - sum(c for s, c in rows.items() if s in FINAL),
                    continuations=sum(store.statuses([approvals.settle_id(k) for k in keys]).values()),
                    paid=_ledger_refunds(ledger, f"x{n}-park-"),
                    probes_paid=_ledger_refunds(ledger, f"x{n}-during-"),
                    full_gc_drain=worker.pauses(ready, drained),
                )
        finally:
            worker.stop()
    out["load_average_end"] = harness.os_load()
    return out


def _per_second(offsets: list[float]) -> list[int]:
    """How many ended in each second after the start."""
    if not offsets:
        return []
    counts = [0] * (int(max(offsets)) + 1)
    for offset in offsets:
        counts[max(int(offset), 0)] += 1
    return counts
