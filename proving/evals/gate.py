"""The baseline a model is held to, and the gate: what makes an evaluation run fail."""

from __future__ import annotations

from pydantic import BaseModel

from proving.evals.results import RunResult


class Baseline(BaseModel):
    """The accuracy a model is held to (CI holds the offline model to its recorded one)."""

    model: str
    dataset_sha256: str
    cases: int
    verdict_accuracy: float
    amount_exactness: float
    reply_checks: float
    tool_recall: float = 0.0
    tool_precision: float = 0.0
    category_accuracy: float = 0.0


def baseline_of(result: RunResult) -> Baseline:
    t = result.totals
    return Baseline(
        model=result.model,
        dataset_sha256=result.dataset_sha256,
        cases=t.cases,
        verdict_accuracy=t.verdict_accuracy,
        amount_exactness=t.amount_exactness,
        reply_checks=t.reply_checks,
        tool_recall=t.tool_recall or 0.0,
        tool_precision=t.tool_precision or 0.0,
        category_accuracy=t.category_accuracy or 0.0,
    )


def violation_problems(result: RunResult) -> list[str]:
    """Money paid that the rules forbid, by the model or by a test model run beside it: must be none."""
    problems = []
    if result.totals.policy_violations:
        problems.append(f"{result.totals.policy_violations} policy violation(s): must be 0")
    for tested in result.test_models:
        if tested.policy_violations:
            problems.append(f"test model {tested.model}: {tested.policy_violations} policy violation(s): must be 0")
    return problems


def accuracy_problems(result: RunResult, baseline: Baseline) -> list[str]:
    """Accuracy, category accuracy or tool recall/precision below the baseline."""
    problems = []
    metrics = ("verdict_accuracy", "amount_exactness", "reply_checks", "tool_recall", "tool_precision")
    for metric in (*metrics, "category_accuracy"):
        now, then = getattr(result.totals, metric) or 0.0, getattr(baseline, metric)
        if now + 1e-9 < then:
            problems.append(f"{metric} {now:.1%} is below the baseline {then:.1%}")
    return problems


def gate(result: RunResult, baseline: Baseline | None) -> list[str]:
    """Why this run fails the gate: any policy violation (of the model, or of a test model run beside it), or
    accuracy, category accuracy or tool recall/precision below the baseline."""
    return violation_problems(result) + ([] if baseline is None else accuracy_problems(result, baseline))
