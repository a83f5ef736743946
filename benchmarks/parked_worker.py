"""A worker process that parks refunds on their approval ``recv`` and reports how many are waiting.

    python -m benchmarks.parked_worker start N     # start N refunds that need approval, then keep running
    python -m benchmarks.parked_worker recover     # just launch: DBOS recovers this executor's workflows

Configuration comes from the environment, as for ``refund-agent worker``. The product's workflow is
unchanged; this process only counts the workflows currently inside ``DBOS.recv_async`` (the approval
wait) and prints ``parked <count> <unix time>`` whenever the count changes (at most every 50 ms), so
the benchmark can time parking and re-parking from outside. It also prints ``gc2 <ms> <unix time>``
after each full (generation 2) garbage collection: one stops every refund in the process while it runs.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from typing import Any

from dbos import DBOS, SetWorkflowID

from agent.settings import get_settings
from benchmarks import harness

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


async def _start(count: int, in_flight: int = 64) -> None:
    """Start ``count`` refunds, keeping at most ``in_flight`` of them between start and parked."""
    from agent.workflow import refund_workflow

    started = 0
    while started < count:
        if started - _waiting >= in_flight:
            await asyncio.sleep(0.01)
            continue
        refund_id, request = await harness.off_loop(harness.new_refund, "parked", harness.APPROVAL_AMOUNT)
        with SetWorkflowID(refund_id):
            await DBOS.start_workflow_async(refund_workflow, refund_id, request.model_dump(mode="json"))
        started += 1
    print(f"started {started} {time.time():.3f}", flush=True)


async def _forever() -> None:
    while True:
        await asyncio.sleep(3600)


def main(argv: list[str]) -> int:
    DBOS.recv_async = _counting_recv  # type: ignore[method-assign]
    threading.Thread(target=_reporter, daemon=True).start()
    _time_full_collections()
    mode = argv[0]
    with harness.started(get_settings()):
        print(f"ready {time.time():.3f}", flush=True)

        async def run() -> None:
            if mode == "start":
                await _start(int(argv[1]))
            await _forever()

        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
