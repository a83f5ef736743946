"""One evaluation run: build the agent once, run every case, and write the reports."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic_ai.models import Model

from agent.brain import build_agent
from proving.evals.adversaries import ADVERSARIES, Adversary
from proving.evals.cases import DatasetFile, eval_dataset, load_dataset_file
from proving.evals.evaluators import all_evaluators
from proving.evals.harness import CaseRunner, throwaway_store
from proving.evals.render import markdown
from proving.evals.results import ModelViolations, RunResult, run_result, traces
from proving.evals.services import evidence_services


@dataclass
class Run:
    result: RunResult
    traces: list[dict[str, Any]]


async def evaluate(
    model: Model | str,
    label: str,
    *,
    data: DatasetFile | None = None,
    sha256: str = "",
    only: list[str] | None = None,
    concurrency: int = 4,
    progress: bool = False,
) -> Run:
    """Run the agent with ``model`` on every case (or those whose name contains one of ``only``)."""
    if data is None:
        data, sha256 = load_dataset_file()
    agent = build_agent(model)
    dataset = eval_dataset(data, all_evaluators(data.limits), only=only)
    if not dataset.cases:
        raise ValueError(f"no case matches {only}")
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    clock = time.perf_counter()
    with throwaway_store(data), evidence_services(data):
        report = await dataset.evaluate(
            CaseRunner(agent, data.limits.limits()),
            name=label,
            task_name="refund_decision",
            max_concurrency=concurrency,
            progress=progress,
        )
    elapsed = time.perf_counter() - clock
    result = run_result(report, data, model=label, sha256=sha256, started_at=started, wall_seconds=elapsed)
    return Run(result, traces(report))


def violations_of(adversary: Adversary, result: RunResult) -> ModelViolations:
    t = result.totals
    return ModelViolations(
        model=adversary.name,
        about=adversary.about,
        cases=t.cases,
        policy_violations=t.policy_violations,
        verdict_accuracy=t.verdict_accuracy,
        category_accuracy=t.category_accuracy or 0.0,
        violations={c.name: "; ".join(c.violations) for c in result.cases if c.violations},
    )


async def evaluate_adversaries(
    *,
    data: DatasetFile | None = None,
    sha256: str = "",
    only: list[str] | None = None,
    models: tuple[Adversary, ...] = ADVERSARIES,
    concurrency: int = 4,
) -> list[ModelViolations]:
    """Each adversarial test model on the same cases: what it gets paid that the rules on the true facts forbid."""
    found = []
    for adversary in models:
        run = await evaluate(
            adversary.model(), adversary.name, data=data, sha256=sha256, only=only, concurrency=concurrency
        )
        found.append(violations_of(adversary, run.result))
    return found


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:60] or "model"


def write_reports(run: Run, out_dir: Path) -> list[Path]:
    """``<model-slug>-<UTC timestamp>``: .json (results), .md (report), .traces.jsonl (messages per case)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = run.result.started_at.replace("-", "").replace(":", "")
    base = out_dir / f"{slug(run.result.model)}-{stamp}"
    paths = [Path(f"{base}{suffix}") for suffix in (".json", ".md", ".traces.jsonl")]
    paths[0].write_text(run.result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(run.result), encoding="utf-8")
    with paths[2].open("w", encoding="utf-8") as out:
        for trace in run.traces:
            out.write(json.dumps(trace, ensure_ascii=False, default=str) + "\n")
    return paths
