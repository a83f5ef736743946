"""The product's worker for the parked-approval section, with a line protocol the benchmark drives.

    python -m benchmarks.parked_worker

Configuration comes from the environment, as for ``refund-agent worker``: the product runtime with
both of its queues and the product's settings. Refunds reach it the product's way (the benchmark
enqueues them on the ``refunds`` queue, as ``POST /refunds`` does). On stdout it prints

- ``ready <unix time>`` once ``runtime.start`` has returned (the time is when it returned; the line
  comes after the benchmark's orders are seeded);
- ``gc2 <ms> <unix time>`` after each full (generation 2) garbage collection, which stops every
  workflow in the process while it runs;
- ``decided <refund id> <called at> <returned at> <outcome>`` for each ``decide <refund id>`` line read
  on stdin: the refund is approved here through the product's decision path in a process where DBOS
  is launched, ``approvals.decide_pending`` with ``approval_workflows.decide_here``, as the HTTP API,
  the console and Slack do in ``refund-agent serve``. Each decision runs on its own thread, so a slow
  one does not hold back the next.

It also registers ``bench_wake_workflow``, a workflow that does nothing, which the benchmark enqueues
version-less on the ``approvals`` queue to time how soon a worker starts a workflow that is woken from
DELAYED against one that is enqueued.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos import DBOS

from agent import approvals, runtime
from agent.approval_workflows import decide_here
from agent.settings import get_settings
from benchmarks import harness
from benchmarks.identities import BENCH_APPROVER
from benchmarks.parked_common import WAKE_WORKFLOW

_out = threading.Lock()


def say(line: str) -> None:
    with _out:
        print(line, flush=True)


@DBOS.workflow(name=WAKE_WORKFLOW)
def wake_workflow() -> None:
    """Nothing: the benchmark reads when a worker started it."""


def _time_full_collections() -> None:
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if info["generation"] != 2:
            return
        if phase == "start":
            started = time.perf_counter()
        else:
            say(f"gc2 {(time.perf_counter() - started) * 1000:.1f} {time.time():.3f}")

    gc.callbacks.append(callback)


def _decide(refund_id: str) -> None:
    called = time.time()
    try:
        result = approvals.decide_pending(
            decide_here, refund_id=refund_id, decision="approve", approver=BENCH_APPROVER, via="console"
        )
        outcome = "first" if result.first else f"stands:{result.record.decision}"
    except Exception as error:  # reported to the benchmark, which counts it
        outcome = f"error:{type(error).__name__}"
    say(f"decided {refund_id} {called:.6f} {time.time():.6f} {outcome}")


def _serve_commands(pool: ThreadPoolExecutor) -> None:
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "decide":
            pool.submit(_decide, parts[1])


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    _time_full_collections()
    runtime.start(get_settings())
    launched = time.time()
    harness.seed_orders()
    say(f"ready {launched:.3f}")
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="decide") as pool:
        _serve_commands(pool)
        threading.Event().wait()  # stdin closed: keep working until killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
