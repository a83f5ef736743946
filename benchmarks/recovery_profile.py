"""Where re-parking time goes: the recovering worker sampled by py-spy, only the thread holding the GIL.

    python -m benchmarks.recovery_profile [--refunds 600] [--rate 200] [--postgres-url URL]

Parks N refunds the product's way (``benchmarks.parked.run_one``), SIGKILLs the worker and starts the
next one under ``py-spy record --gil``. Sampling only the thread that holds the GIL counts the Python
work of every thread (the event loop running the workflows, DBOS's executor threads doing their
checkpoint reads, the queue thread) and none of their waits for the database. Once all N wait again
the worker is interrupted; the samples of the frames below are summed (a frame counts once per
sample, wherever it is on the stack) and shown as milliseconds of GIL time per re-parked refund.
Start-up (imports, migrations) runs on the main thread, which the table leaves out. Writes
``results/recovery_profile-<UTC timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks import harness, parked

#: (label, frame): frames as py-spy names them, "function (package/module.py)".
FRAMES = [
    ("all worker threads (start-up on the main thread left out)", "Thread.run (threading.py)"),
    ("  the event loop thread", "BaseEventLoop.run_forever (asyncio/base_events.py)"),
    (
        "    Pydantic AI's graph nodes, replayed (they run as tasks of their own)",
        "_GraphIterator._run_tracked_task (pydantic_graph/graph_builder.py)",
    ),
    ("      model request nodes (4 recorded model responses)", "ModelRequestNode.run (pydantic_ai/_agent_graph.py)"),
    ("      tool call nodes (the order and history reads)", "CallToolsNode.run (pydantic_ai/_agent_graph.py)"),
    ("    refund_workflow's own frames (outside the graph's tasks)", "refund_workflow (agent/workflow.py)"),
    ("  DBOS's executor threads (blocking database calls)", "_worker (concurrent/futures/thread.py)"),
    ("    read a step's recorded result (system DB)", "SystemDatabase.check_operation_execution (dbos/_sys_db.py)"),
    ("    datasource transaction step, replayed (app DB)", "SQLAlchemyDatasource.run_tx_step (dbos/_datasource.py)"),
    ("    recv set-up: recorded message or timer, then register", "SystemDatabase.recv_setup (dbos/_sys_db.py)"),
    ("  the queue thread (dequeue, status reads)", "queue_worker_thread (dbos/_queue.py)"),
    ("SQLAlchemy execute (all statements, any thread)", "Connection.execute (sqlalchemy/engine/base.py)"),
    ("psycopg: send and wait, GIL held", "Cursor.execute (psycopg/cursor.py)"),
]
_LINE = re.compile(r":\d+\)$")


def summarize(raw: str, rate: float, refunds: int) -> list[dict[str, Any]]:
    inclusive: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = {_LINE.sub(")", frame) for frame in stack.split(";")}
        for frame in frames:
            inclusive[frame] += int(count)
    return [
        {"what": label, "frame": frame, "ms_per_refund": inclusive[frame] / rate * 1000 / refunds}
        for label, frame in FRAMES
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.recovery_profile", description=__doc__.split("\n")[0])
    p.add_argument("--refunds", type=int, default=600, help="refunds parked, then re-parked under the profiler")
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--postgres-url", default=harness.DEFAULT_POSTGRES)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if shutil.which("py-spy") is None:
        p.error("py-spy is not installed: pip install -e '.[bench]'")
    with harness.workdir() as workdir, harness.sandbox(workdir) as sandbox_url:
        raw_file = workdir / "recovery.txt"
        sampler = ["py-spy", "record", "--gil", "--rate", str(args.rate), "--format", "raw"]
        sampler += ["--output", str(raw_file), "--"]
        run = parked.run_one(
            args.refunds,
            approvals_k=0,
            approval_rate=1,
            server=args.postgres_url,
            sandbox_url=sandbox_url,
            workdir=workdir,
            timeout=900,
            probes=False,
            recover_prefix=sampler,
        )
        rows = summarize(raw_file.read_text(), args.rate, args.refunds)
    wall = run["kill_to_all_parked_s"]
    print(
        f"{args.refunds} refunds re-parked in {wall:.1f} s after SIGKILL ({wall / args.refunds * 1000:.1f} ms each)\n"
    )
    print("| where (GIL held, per re-parked refund) | frame | ms |")
    print("|---|---|---:|")
    for row in rows:
        print(f"| {row['what']} | `{row['frame']}` | {harness.fmt(row['ms_per_refund'])} |")
    if not args.no_write:
        harness.RESULTS.mkdir(parents=True, exist_ok=True)
        out = harness.RESULTS / f"recovery_profile-{harness.utc_stamp()}.json"
        document = {"run": run, "rows": rows, "args": vars(args), "environment": harness.environment()}
        out.write_text(json.dumps(document, indent=1, default=str))
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
