"""Section 3: refunds parked for approval in one worker (Postgres), now that a parked refund is rows.

For each count N (0, 1,000 and 10,000 in the full run), on fresh databases, with one worker process
(``benchmarks.parked_worker``: the product runtime with both queues and the product's settings):

1. Throughput: chunks of refunds submitted the product's way (``submit_refund``, what ``POST /refunds``
   calls) as fast as this process can, auto-approved chunks (0.01 USD, paid at once) and chunks that
   need approval (150.00 USD, parked) alternating, until N are parked. A chunk's rate is its size over
   the time from its first submit to the end of its last ``refund_workflow`` (``updated_at``); a parked
   refund's deciding workflow ends once its approval is open and its deadline is a DELAYED workflow.
2. Restarts: R times, SIGKILL the worker and start a new one with the same executor id. Counted: the
   PENDING workflows at restart (what DBOS would recover); timed: the new process from spawn until
   ``runtime.start`` returned, and an auto-approved refund submitted as soon as it is ready.
3. Idle: each new worker, once its refund is done and it has nothing to do, over a fixed window: its
   CPU time (psutil) and that of the Postgres backends connected to the run's databases; its RSS.
4. Approvals (N > 0): K parked refunds approved at a steady rate, first inside the worker through the
   API's path (``decide_pending`` with ``decide_here``), then from this process through the CLI's path
   (``decide_pending`` with ``decider_via_queue``); latency from the call to the end of the refund's
   continuation (``{id}/settle``, ``updated_at``).

``benchmarks.wake_latency`` (in the largest run) and ``benchmarks.parked_expiry`` (its own run) add
the two remaining measurements.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dbos import DBOSClient

from agent import approvals, questions, status
from benchmarks import harness, parked_expiry, wake_latency
from benchmarks.harness import APPROVAL_AMOUNT, AUTO_AMOUNT
from benchmarks.identities import BENCH_APPROVER
from benchmarks.parked_common import (
    ASK_AMOUNT,
    Store,
    Worker,
    await_ended,
    idle_sample,
    latency_summary,
    opened,
    probe_auto,
    submit,
    worker_env,
)

#: What a refund of each kind asks for: paid at once, parked for a person, or (on a shipped order) asking its customer.
AMOUNTS = {"auto": AUTO_AMOUNT, "park": APPROVAL_AMOUNT, "ask": ASK_AMOUNT}


def chunk_of(client: DBOSClient, store: Store, kind: str, keys: list[str], timeout: float) -> dict[str, Any]:
    """Submit ``keys`` of one kind back to back and wait for all their deciding workflows to end."""
    first = time.time()
    for i, key in enumerate(keys):
        submit(client, key, AMOUNTS[kind], i, ask=kind == "ask")
    submitted = time.time() - first
    ended = await_ended(store, keys, timeout, interval=0.5)
    took = max(ended.values(), default=first) - first
    out: dict[str, Any] = {
        "kind": kind,
        "n": len(keys),
        "s": took,
        "per_s": len(ended) / took if took > 0 else None,
        "submit_s": submitted,
        "not_ended": len(keys) - len(ended),
        "rows": dict(store.refund_rows(keys)),  # completed / awaiting_approval, by the refund's own row
    }
    if kind == "park":
        out["deadlines"] = dict(store.statuses([approvals.deadline_id(k) for k in keys]))
    elif kind == "ask":  # waiting on the customer: the question open, its reminder and deadline DELAYED
        out["questions"] = dict(store.questions(keys))
        out["timers"] = dict(store.statuses([t(k) for k in keys for t in (questions.reminder_id, questions.expiry_id)]))
    return out


def throughput(
    client: DBOSClient,
    store: Store,
    worker: Worker,
    n: int,
    chunk: int,
    timeout: float,
    kinds: tuple[str, ...] = ("auto", "park"),
    tag: str = "",
) -> dict[str, Any]:
    """A chunk of each kind per round (which goes first rotates by round) until ``n`` are parked (of the last kind).

    Keys are ``{tag}n{n}-{kind}-{round}-{i}``; per kind, the median chunk's rate and the overall rate."""
    chunks: list[dict[str, Any]] = []
    parked: list[str] = []
    t0, r = time.time(), 0
    while len(parked) < n:
        size = min(chunk, n - len(parked))
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            keys = [f"{tag}n{n}-{kind}-{r:03d}-{i:05d}" for i in range(size)]
            chunks.append(chunk_of(client, store, kind, keys, timeout))
            if kind == kinds[-1]:
                parked += keys
        print(f"    {tag}{len(parked):,}/{n:,} of each waiting", flush=True)
        r += 1
    out: dict[str, Any] = {"chunk": chunk, "chunks": chunks}
    for kind in kinds:
        rates = [c["per_s"] for c in chunks if c["kind"] == kind and c["per_s"]]
        total, seconds = (sum(c[k] for c in chunks if c["kind"] == kind) for k in ("n", "s"))
        out[f"{kind}_per_s"] = harness.median(rates)
        out[f"{kind}_overall_per_s"] = harness.ratio(total, seconds)
    if "auto" in kinds:
        out["park_vs_auto"] = harness.ratio(out["park_per_s"], out["auto_per_s"])
    sample = parked if len(parked) <= 100 else random.Random(n).sample(parked, 100)
    out["status_parked_sample"] = [len(sample), sum(status.parked(client, i) is not None for i in sample)]
    out["full_gc"] = worker.pauses(t0, time.time())
    return out


def _restart(
    worker: Worker, store: Store, client: DBOSClient, env: dict[str, str], log: Path, key: str, idle: Any
) -> tuple[Worker, dict[str, Any]]:
    """SIGKILL ``worker``, start a new one with the same executor id, probe it with one auto-approved refund,
    then let ``idle(worker)`` measure it at rest."""
    pending_before = store.count_status("PENDING")
    killed = worker.kill()
    sample: dict[str, Any] = {
        "pending_before_kill": pending_before,
        "pending_at_restart": store.count_status("PENDING"),
        "enqueued_at_restart": store.count_status("ENQUEUED"),
        "delayed_at_restart": store.count_status("DELAYED"),
    }
    new = Worker(env, log)
    ready = new.wait_ready()
    sample.update(spawn_to_ready_s=ready - new.spawned_at, kill_to_ready_s=ready - killed)
    sample["new_refund_s"] = probe_auto(client, store, key)
    sample.update(idle(new))  # a new worker that has run one refund, whatever is parked
    return new, sample


def _approve_in_worker(worker: Worker, ids: list[str], rate: float) -> dict[str, float]:
    for refund_id in ids:
        t = time.monotonic()
        worker.decide(refund_id)
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - t)))
    worker.wait("the decisions to return", lambda: all(i in worker.decided for i in ids), 120)
    return {i: worker.decided[i][0] for i in ids}


def _approve_via_queue(client: DBOSClient, ids: list[str], rate: float) -> tuple[dict[str, float], list[str]]:
    decider = approvals.decider_via_queue(client)
    called: dict[str, float] = {}
    errors: list[str] = []

    def decide(refund_id: str) -> None:
        called[refund_id] = time.time()
        try:
            approvals.decide_pending(
                decider, refund_id=refund_id, decision="approve", approver=BENCH_APPROVER, via="console"
            )
        except approvals.ApprovalError as error:
            errors.append(f"{refund_id}: {error.code}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        for refund_id in ids:
            t = time.monotonic()
            pool.submit(decide, refund_id)
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - t)))
    return called, errors


def _approvals(worker: Worker, store: Store, client: DBOSClient, n: int, k: int, rate: float) -> dict[str, Any]:
    out: dict[str, Any] = {"rate_per_s": rate}
    for path in ("api", "cli"):
        ids = store.oldest_parked(f"n{n}-park-", k)
        t0 = time.time()
        errors: list[str] = []
        if path == "api":
            called = _approve_in_worker(worker, ids, rate)
            errors = [f"{i}: {worker.decided[i][2]}" for i in ids if worker.decided[i][2].startswith("error")]
            calls = [worker.decided[i][1] - worker.decided[i][0] for i in ids]
        else:
            called, errors = _approve_via_queue(client, ids, rate)
            calls = []
        settled = await_ended(store, [approvals.settle_id(i) for i in ids], 120)
        latencies = [settled[approvals.settle_id(i)] - called[i] for i in ids if approvals.settle_id(i) in settled]
        out[path] = {
            "approved": len(ids),
            "completed": store.refund_rows(ids).get("completed", 0),
            "errors": errors,
            "approve_to_completed_ms": latency_summary(latencies, scale=1000),
            "decision_call_ms": latency_summary(calls, scale=1000) if calls else None,
            "full_gc": worker.pauses(t0, max(settled.values(), default=t0)),
        }
    return out


def run_count(
    n: int,
    *,
    server: str,
    sandbox_url: str,
    workdir: Path,
    chunk: int,
    restarts: int,
    idle_seconds: float,
    approvals_k: int,
    approval_rate: float,
    wakes: int,
    timeout: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {"parked": n, "load_average_start": list(harness.os_load())}
    with harness.databases("postgres", server, workdir) as dbs:
        env = worker_env(dbs, sandbox_url, workdir)
        log = workdir / f"parked-{n}.log"
        worker = Worker(env, log)
        try:
            worker.wait_ready()
            with opened(dbs, workdir) as (store, client):
                probe_auto(client, store, f"n{n}-warm-up")  # the first refund pays this process's warm-up
                if n:
                    out["throughput"] = throughput(client, store, worker, n, chunk, timeout)
                    out["rss_after_parking_mb"] = worker.rss_mb()
                samples = []

                def idle(w: Worker) -> dict[str, Any]:
                    return idle_sample(w, server, dbs, idle_seconds)

                for r in range(restarts):
                    worker, sample = _restart(worker, store, client, env, log, f"n{n}-restart-{r}", idle)
                    samples.append(sample)
                out["restarts"] = {
                    "samples": samples,
                    "pending_at_restart": max(s["pending_at_restart"] for s in samples),
                }
                for key in ("spawn_to_ready_s", "new_refund_s", "rss_mb", "worker_cpu_pct", "postgres_cpu_pct"):
                    out["restarts"][key] = harness.median([s[key] for s in samples if s[key] is not None])
                if n and approvals_k:
                    out["approvals"] = _approvals(worker, store, client, n, min(approvals_k, n // 2), approval_rate)
                if wakes:
                    out["wake"] = wake_latency.compare(client, store, wakes)
        finally:
            worker.stop()
    out["load_average_end"] = list(harness.os_load())
    return out


def run_section(
    *,
    counts: list[int],
    chunk: int,
    restarts: int,
    idle_seconds: float,
    approvals_k: int,
    approval_rate: float,
    wakes: int,
    expiry_n: int,
    expiry_timeout: float | None,
    expiry_probes: int,
    server: str,
    sandbox_url: str,
    workdir: Path,
    timeout: float,
) -> dict[str, Any]:
    common: dict[str, Any] = {"server": server, "sandbox_url": sandbox_url, "workdir": workdir, "timeout": timeout}
    runs: list[dict[str, Any]] = []
    for n in counts:
        print(f"  parked approvals: N={n:,}", flush=True)
        try:
            run = run_count(
                n,
                chunk=chunk,
                restarts=restarts,
                idle_seconds=idle_seconds,
                approvals_k=approvals_k,
                approval_rate=approval_rate,
                wakes=wakes if n == max(counts) else 0,
                **common,
            )
        except (TimeoutError, RuntimeError) as error:
            run = {"parked": n, "error": str(error)}
        runs.append(run)
    out: dict[str, Any] = {
        "design": "rows",  # a parked refund is rows; earlier results measured recv waits
        "settings": {
            "chunk": chunk,
            "restarts": restarts,
            "idle_seconds": idle_seconds,
            "approval_rate": approval_rate,
        },
        "runs": runs,
    }
    wake = next((r.pop("wake") for r in runs if "wake" in r), None)
    if wake is not None:
        out["wake"] = wake
    if expiry_n:
        rate = next((r["throughput"]["park_per_s"] for r in reversed(runs) if r.get("throughput")), None)
        t = expiry_timeout or parked_expiry.timeout_for(expiry_n, rate)
        print(f"  parked approvals: {expiry_n:,} expiring at once (approval timeout {t:.0f} s)", flush=True)
        try:
            out["expiry"] = parked_expiry.run(expiry_n, approval_timeout=t, probes=expiry_probes, **common)
        except (TimeoutError, RuntimeError) as error:
            out["expiry"] = {"expiring": expiry_n, "error": str(error)}
    return out
