"""A product worker that reports how many workflows wait in ``DBOS.recv`` (the approval wait).

    python -m benchmarks.parked_worker

Configuration comes from the environment, as for ``refund-agent worker``: this is the product runtime
with its queue worker, so refunds reach it the product's way (the benchmark enqueues them on the
``refunds`` queue, as ``POST /refunds`` does), and after a SIGKILL a new process with the same
executor id recovers them through that queue. The product's workflow is unchanged; this process only
counts the workflows currently inside ``DBOS.recv_async`` and prints ``parked <count> <unix time>``
whenever the count changes (at most every 50 ms), so the benchmark can time parking and re-parking
from outside. It prints ``gc2 <ms> <unix time>`` after each full (generation 2) garbage collection:
one stops every refund in the process while it runs.

It also registers the floor the product is compared with, ``bench_floor_workflow(steps)``: ``steps``
checkpointed no-op steps, then the refund's approval wait (same topic, timeout and queue slot
release), run from the same queue with the same settings. With ``steps=0`` it is what DBOS itself
costs to start, park and recover a workflow that does nothing but wait.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from typing import Any

from dbos import DBOS

from agent.approvals import APPROVAL_TOPIC
from agent.offloop import call
from agent.parking import queue_slot_released
from agent.runtime import current
from agent.settings import get_settings
from benchmarks import harness

FLOOR_WORKFLOW = "bench_floor_workflow"

_waiting = 0
_lock = threading.Lock()
_product_recv = DBOS.recv_async


async def _counting_recv(topic: str | None = None, timeout_seconds: float = 60) -> Any:
    global _waiting
    with _lock:
        _waiting += 1
    try:
        return await _product_recv(topic, timeout_seconds)
    finally:
        with _lock:
            _waiting -= 1


@DBOS.step(name="bench.noop")
def _noop_step(i: int) -> int:
    return i


@DBOS.workflow(name=FLOOR_WORKFLOW)
async def floor_workflow(steps: int) -> None:
    for i in range(steps):
        await call(_noop_step, i)
    with queue_slot_released():
        await DBOS.recv_async(APPROVAL_TOPIC, timeout_seconds=current().approvals.escalate_after)


def _time_full_collections() -> None:
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if info["generation"] != 2:
            return
        if phase == "start":
            started = time.perf_counter()
        else:
            print(f"gc2 {(time.perf_counter() - started) * 1000:.1f} {time.time():.3f}", flush=True)

    gc.callbacks.append(callback)


def _reporter() -> None:
    last = -1
    while True:
        now = _waiting
        if now != last:
            print(f"parked {now} {time.time():.3f}", flush=True)
            last = now
        time.sleep(0.05)


async def _forever() -> None:
    while True:
        await asyncio.sleep(3600)


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    DBOS.recv_async = _counting_recv  # type: ignore[method-assign]
    threading.Thread(target=_reporter, daemon=True).start()
    _time_full_collections()
    with harness.started(get_settings()):
        print(f"ready {time.time():.3f}", flush=True)
        asyncio.run(_forever())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
