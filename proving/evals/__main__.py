"""`refund-agent eval` / `python -m proving.evals`: evaluate the configured model, or compare two runs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.runtime import select_model
from agent.settings import Settings
from proving.evals.cases import load_dataset_file
from proving.evals.gate import Baseline, baseline_of, gate
from proving.evals.render import compare, print_terminal
from proving.evals.results import load_result
from proving.evals.run import evaluate, evaluate_adversaries, write_reports


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refund-agent eval",
        description="Run the refund agent on the evaluation dataset with the configured model "
        "(REFUND_AGENT_MODEL / REFUND_AGENT_MODEL_BASE_URL; default: the offline model). Nothing is paid.",
    )
    p.add_argument("--dataset", type=Path, help="dataset YAML (default: the packaged proving/evals/dataset.yaml)")
    p.add_argument("--case", action="append", metavar="NAME", help="only cases whose name contains NAME, or a category")
    p.add_argument("--concurrency", type=int, default=4, help="cases run at once (default 4)")
    p.add_argument("--out", type=Path, default=Path("evals/results"), help="where reports go (default evals/results)")
    p.add_argument("--no-write", action="store_true", help="print only; write no report files")
    p.add_argument("--baseline", type=Path, help="fail (exit 1) if accuracy is below this baseline JSON")
    p.add_argument("--record-baseline", type=Path, metavar="PATH", help="write this run's accuracy as a baseline")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument(
        "--test-models",
        action="store_true",
        help="also run the adversarial test models (misfiling, ticket-steered, ...) on the same cases and report "
        "their policy violations (any fails the run)",
    )
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"), help="print two runs side by side")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.compare:
        print(compare(load_result(args.compare[0]), load_result(args.compare[1])), end="")
        return 0
    if args.case and (args.baseline or args.record_baseline):
        print("--baseline and --record-baseline need the whole dataset (drop --case)", file=sys.stderr)
        return 2
    baseline = Baseline.model_validate_json(args.baseline.read_text()) if args.baseline else None
    data, sha256 = load_dataset_file(args.dataset)
    model, label = select_model(Settings().model)
    run = asyncio.run(
        evaluate(
            model,
            label,
            data=data,
            sha256=sha256,
            only=args.case,
            concurrency=max(1, args.concurrency),
            progress=args.progress,
        )
    )
    if args.test_models:
        tested = asyncio.run(
            evaluate_adversaries(data=data, sha256=sha256, only=args.case, concurrency=max(1, args.concurrency))
        )
        run.result = run.result.model_copy(update={"test_models": tested})
    print_terminal(run.result)
    if not args.no_write:
        for path in write_reports(run, args.out):
            print(f"wrote {path}")
    if args.record_baseline:
        args.record_baseline.write_text(baseline_of(run.result).model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"recorded the baseline in {args.record_baseline}")
    if baseline is not None and baseline.dataset_sha256 != sha256:
        print("note: the baseline was recorded on another version of the dataset; re-record it if cases changed")
    problems = gate(run.result, baseline)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
