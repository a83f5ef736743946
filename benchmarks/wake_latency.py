"""How soon a worker starts a workflow: woken from DELAYED, or enqueued at the moment it is wanted.

The decision workflow enqueues the refund's continuation rather than waking one enqueued DELAYED when
the refund parked. This measures the two side by side, on the same worker and queue (``approvals``,
version-less, as the product enqueues its continuations), with ``bench_wake_workflow``, which does
nothing:

- *DELAYED + set_workflow_delay(0)*: enqueued an hour ahead, then made due now;
- *enqueue at decision*: enqueued now.

Wakes alternate between the two, which one goes first alternating too, a random 0.3-1.2 s apart (a
fixed seed), so neither keeps one phase of DBOS's once-a-second DELAYED sweep or of the queue's poll.
Latency is from just before the call to ``started_at_epoch_ms``, when a worker dequeued it.
"""

from __future__ import annotations

import random
import time
from typing import Any

from dbos import DBOSClient, EnqueueOptions

from agent.approvals import APPROVAL_QUEUE
from benchmarks.parked_common import WAKE_WORKFLOW, Store, await_ended, latency_summary

ARMS = ("DELAYED + set_workflow_delay(0)", "enqueue at decision")


def _options(workflow_id: str) -> EnqueueOptions:
    return {"queue_name": APPROVAL_QUEUE, "workflow_name": WAKE_WORKFLOW, "workflow_id": workflow_id}


def compare(client: DBOSClient, store: Store, wakes: int, *, seed: int = 16) -> dict[str, Any]:
    """``wakes`` wakes per arm; their wake -> start latencies (ms)."""
    tag = f"wake-{int(time.time())}"
    delayed = [f"{tag}-delayed-{i:03d}" for i in range(wakes)]
    for workflow_id in delayed:
        client.enqueue({**_options(workflow_id), "delay_seconds": 3600.0})
    woken: dict[str, float] = {}
    pause = random.Random(seed)
    for i in range(wakes):
        for arm in ARMS if i % 2 == 0 else tuple(reversed(ARMS)):
            if arm == ARMS[0]:
                workflow_id = delayed[i]
                woken[workflow_id] = time.time()
                client.set_workflow_delay(workflow_id, delay_seconds=0)
            else:
                workflow_id = f"{tag}-enqueued-{i:03d}"
                woken[workflow_id] = time.time()
                client.enqueue(_options(workflow_id))
            time.sleep(pause.uniform(0.3, 1.2))
    await_ended(store, list(woken), 60)
    found = store.workflows(list(woken))
    out: dict[str, Any] = {"wakes": wakes, "arms": list(ARMS)}
    for arm, marker in zip(ARMS, ("-delayed-", "-enqueued-"), strict=True):
        ids = [w for w in woken if marker in w]
        started = [(found[w][1] or 0) - woken[w] for w in ids if w in found and found[w][1] is not None]
        out[arm] = {"wake_to_start_ms": latency_summary(started, scale=1000), "samples_ms": [s * 1000 for s in started]}
    return out
