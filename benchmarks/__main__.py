"""The benchmark suite: durability cost per refund, throughput, parked approvals, tuning, profile, round trips,
refunds waiting on customers beside approvers.

    python -m benchmarks [--quick] [--sections cost,throughput,parked,tuning,profile,round_trips,customer_waits] ...

Needs the ``bench`` extra (LangGraph, its savers, matplotlib, psutil) and a Postgres server on
127.0.0.1 (``--postgres-url``; it creates and drops its own databases). Prints Markdown tables, writes
``benchmarks/results/suite-<UTC>.json`` and PNG plots, and replaces the results block of
``benchmarks/README.md`` (``--no-readme`` leaves it alone; ``--no-write`` writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shlex
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks import harness

SECTIONS = ("cost", "throughput", "parked", "tuning", "profile", "round_trips", "customer_waits")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts and 3 rounds: a few minutes")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--rounds", type=int, help="rounds for cost and throughput (default 5, quick 3)")
    p.add_argument("--refunds", type=int, help="refunds per variant per round in the cost section (default 15)")
    p.add_argument(
        "--count-refunds", type=int, help="refunds per variant in the Postgres commit-count pass (0 skips it)"
    )
    p.add_argument("--levels", default="1,4,16,64", help="concurrency levels of the throughput section")
    p.add_argument("--throughput-refunds", type=int, help="refunds per cell: max(this, 2 x C) (default 24)")
    p.add_argument("--parked", help="counts of parked refunds, one run each (default 0,1000,10000; quick 0,20)")
    p.add_argument("--parked-chunk", type=int, help="refunds per throughput chunk (default 500; quick 10)")
    p.add_argument("--restarts", type=int, help="SIGKILL + restart cycles per count (default 5; quick 2)")
    p.add_argument("--idle-seconds", type=float, help="idle window of each restarted worker, s (default 30; quick 3)")
    p.add_argument("--approvals", type=int, help="approvals per decision path in the parked section (default 60)")
    p.add_argument("--approval-rate", type=float, default=3.0, help="approvals per second (default 3)")
    p.add_argument("--wakes", type=int, help="wakes per arm of the wake-latency comparison (default 30; quick 4)")
    p.add_argument("--expiring", type=int, help="refunds whose deadlines fall due at once (default 10000; 0 skips)")
    p.add_argument(
        "--expiry-probes", type=int, help="auto-approved refunds timed before the expiry (default 10; quick 3)"
    )
    p.add_argument("--expiry-timeout", type=float, help="their approval timeout, s (default: passes after parking)")
    p.add_argument(
        "--parked-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for a chunk to park or complete (at least 0.5 s per refund)",
    )
    p.add_argument(
        "--customer-waits",
        type=int,
        help="customer_waits: refunds waiting on customers, and as many on approvers (default 2000; quick 10)",
    )
    p.add_argument("--tuning-rounds", type=int, help="rounds per tuning knob (default 3, quick 2)")
    p.add_argument("--tuning-only", help="only knobs whose name contains this")
    p.add_argument("--profile-refunds", type=int, help="refunds profiled per backend (default 20)")
    p.add_argument("--rt-rounds", type=int, help="rounds of the round-trips section (default 5, quick 2)")
    p.add_argument("--rt-refunds", type=int, help="refunds per variant per round there (default 10, quick 3)")
    p.add_argument("--postgres-url", default=harness.DEFAULT_POSTGRES)
    p.add_argument("--no-readme", action="store_true", help="do not rewrite benchmarks/README.md")
    p.add_argument("--no-write", action="store_true", help="write no JSON, plots or README")
    p.add_argument("--results-dir", type=Path, default=harness.RESULTS)
    args = p.parse_args(argv)
    q = args.quick
    args.rounds = args.rounds or (3 if q else 5)
    args.refunds = args.refunds or (5 if q else 15)
    if args.count_refunds is None:
        args.count_refunds = 5 if q else 15
    args.throughput_refunds = args.throughput_refunds or (8 if q else 24)
    args.parked = [int(x) for x in (args.parked or ("0,20" if q else "0,1000,10000")).split(",") if x]
    args.parked_chunk = args.parked_chunk or (10 if q else 500)
    args.restarts = args.restarts or (2 if q else 5)
    args.idle_seconds = args.idle_seconds or (3.0 if q else 30.0)
    args.approvals = args.approvals or (3 if q else 60)
    if args.wakes is None:
        args.wakes = 4 if q else 30
    if args.expiring is None:
        args.expiring = 20 if q else 10_000
    args.expiry_probes = args.expiry_probes or (3 if q else 10)
    if args.expiry_timeout is None and q:
        args.expiry_timeout = 15.0
    args.customer_waits = args.customer_waits or (10 if q else 2000)
    args.tuning_rounds = args.tuning_rounds or (2 if q else 3)
    args.profile_refunds = args.profile_refunds or (5 if q else 20)
    args.rt_rounds = args.rt_rounds or (2 if q else 5)
    args.rt_refunds = args.rt_refunds or (3 if q else 10)
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if (urlsplit(args.postgres_url).hostname or "") not in ("127.0.0.1", "localhost", "::1"):
        p.error("--postgres-url must point at this machine")
    return args


def _per_level(base: int, concurrency: int) -> int:
    return max(base, 2 * concurrency)


async def run(args: argparse.Namespace, sandbox_url: str, workdir: Path) -> dict[str, Any]:
    from benchmarks import cost, parked, parked_customers, profile, round_trips, throughput, tuning

    results: dict[str, Any] = {}
    common = {"server": args.postgres_url, "sandbox_url": sandbox_url, "workdir": workdir}
    for section in args.sections:
        t0 = time.monotonic()
        print(f"== {section}", flush=True)
        if section == "cost":
            results["cost"] = await cost.run_section(
                rounds=args.rounds, refunds=args.refunds, count_refunds=args.count_refunds, **common
            )
        elif section == "throughput":
            levels = [int(x) for x in args.levels.split(",")]
            results["throughput"] = await throughput.run_section(
                rounds=max(3, args.rounds - 2),
                levels=levels,
                refunds_per_level=functools.partial(_per_level, args.throughput_refunds),
                **common,
            )
        elif section == "parked":
            results["parked"] = await harness.off_loop(
                lambda: parked.run_section(
                    counts=args.parked,
                    chunk=args.parked_chunk,
                    restarts=args.restarts,
                    idle_seconds=args.idle_seconds,
                    approvals_k=args.approvals,
                    approval_rate=args.approval_rate,
                    wakes=args.wakes,
                    expiry_n=args.expiring,
                    expiry_timeout=args.expiry_timeout,
                    expiry_probes=args.expiry_probes,
                    timeout=args.parked_timeout,
                    **common,
                )
            )
        elif section == "customer_waits":
            results["customer_waits"] = await harness.off_loop(
                lambda: parked_customers.run_or_error(
                    n=args.customer_waits,
                    chunk=args.parked_chunk,
                    restarts=args.restarts,
                    idle_seconds=args.idle_seconds,
                    timeout=args.parked_timeout,
                    **common,
                )
            )
        elif section == "tuning":
            results["tuning"] = await tuning.run_section(
                rounds=args.tuning_rounds, refunds=args.refunds, concurrency=16, only=args.tuning_only, **common
            )
        elif section == "profile":
            results["profile"] = await profile.run_section(refunds=args.profile_refunds, **common)
        elif section == "round_trips":
            results["round_trips"] = await round_trips.run_section(
                rounds=args.rt_rounds, refunds=args.rt_refunds, **common
            )
        print(f"== {section}: {time.monotonic() - t0:.0f} s", flush=True)
    return results


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks import report

    warnings.filterwarnings("ignore", category=UserWarning)  # LangGraph: durability without a checkpointer
    # SIGTERM unwinds like Ctrl-C, so child processes stop and the databases are dropped.
    signal.signal(signal.SIGTERM, _interrupt)
    args = parse_args(argv)
    started = datetime.now(UTC)
    load_at_start = harness.os_load()
    stamp = harness.utc_stamp()
    with harness.workdir() as workdir, harness.sandbox(workdir) as sandbox_url:
        results = asyncio.run(run(args, sandbox_url, workdir))
    results["meta"] = {
        "started": started.strftime("%Y-%m-%d %H:%M"),
        "finished": datetime.now(UTC).strftime("%H:%M"),
        "command": "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
        "environment": {**harness.environment(), "load_average_at_start": load_at_start},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    json_name = f"suite-{stamp}.json"
    pngs: list[str] = []
    if not args.no_write:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / json_name).write_text(json.dumps(results, indent=1, default=str))
        pngs = report.plots(results, args.results_dir, stamp)
    block = report.markdown(results, json_name, pngs)
    print(block)
    if not args.no_write and not args.no_readme:
        report.update_readme(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
