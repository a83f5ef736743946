"""The `refund-agent` subcommands that exercise the product from outside: demo, chaos, eval.

Each ``register_*`` is an entry point of the ``refund_agent.commands`` group (pyproject.toml); the command
line (``agent.cli``) loads them, so the product never imports this package.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.settings import get_settings


def cmd_demo(_: argparse.Namespace) -> int:
    from proving.demo import run_demo

    return run_demo(get_settings())


def register_demo(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the worked example: crash, recovery, approval, one refund")
    demo.set_defaults(func=cmd_demo, quiet=True)


def cmd_chaos(args: argparse.Namespace) -> int:
    from proving.chaos import ChaosConfig, run_chaos

    config = ChaosConfig(
        refunds=args.refunds,
        kills=args.kills,
        workers=args.workers,
        seed=args.seed,
        postgres_url=args.postgres_url,
        fail_rate=args.fail_rate,
        drop_rate=args.drop_rate,
        pending_rate=args.pending_rate,
        pending_fail_share=args.pending_fail_share,
        latency_ms=args.latency_ms,
        pg_restart=args.pg_restart,
        max_unanswered=args.max_unanswered,
        max_seconds=args.max_seconds,
        settle_seconds=args.settle_seconds,
        work_dir=Path(args.dir) if args.dir else get_settings().database.data_dir / "chaos",
        out=Path(args.out) if args.out else None,
        keep=args.keep,
    )
    return 0 if run_chaos(config)["ok"] else 1


def register_chaos(sub: Any) -> None:
    c = sub.add_parser("chaos", help="seeded soak: kills, payment faults, approvals; prints and writes a verdict")
    c.add_argument("--refunds", type=int, default=40, help="refund requests to submit (max 5000)")
    c.add_argument("--kills", type=int, default=5, help="SIGKILLs of serve/workers at seeded moments (max 500)")
    c.add_argument("--workers", type=int, default=2, help="worker processes besides serve")
    c.add_argument("--seed", type=int, default=1, help="same seed, same workload and fault schedule")
    c.add_argument("--postgres-url", help="Postgres server to create the run's databases on (default: SQLite)")
    c.add_argument("--fail-rate", type=float, default=0.1, help="payment API 500s before applying")
    c.add_argument("--drop-rate", type=float, default=0.1, help="payment applied but its response lost")
    c.add_argument("--latency-ms", type=int, default=20, help="payment API latency")
    c.add_argument("--pending-rate", type=float, default=0.15, help="provider refunds that settle late (pending)")
    c.add_argument("--pending-fail-share", type=float, default=0.3, help="of those, the share that then fail")
    c.add_argument("--pg-restart", metavar="VERSION/CLUSTER", help="restart this local cluster once (opt-in)")
    c.add_argument("--max-unanswered", type=int, default=2, help="approval requests left unanswered on purpose")
    c.add_argument("--max-seconds", type=float, default=900, help="bound on the whole run")
    c.add_argument("--settle-seconds", type=float, default=180, help="after faults stop, time to finish")
    c.add_argument("--dir", help="work directory (logs, SQLite files); default DATA_DIR/chaos")
    c.add_argument("--out", help="write the verdict JSON here")
    c.add_argument("--keep", action="store_true", help="keep the run's Postgres databases")
    c.set_defaults(func=cmd_chaos, quiet=True)


def _eval(argv: list[str]) -> int:
    from proving.evals.__main__ import main as eval_main

    return eval_main(argv)


def register_eval(sub: Any) -> None:
    # Its own parser (`refund-agent eval --help`): every flag after `eval` is handed to it untouched.
    sub.add_parser(
        "eval", help="evaluate the agent's refund decisions on the dataset (any model); eval --help", add_help=False
    ).set_defaults(passthrough=_eval)
