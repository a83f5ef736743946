"""A run's results as plain data (the JSON file), totals, traces, and the baseline gate."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_evals.reporting import EvaluationReport, ReportCase

from proving.evals.cases import CaseMeta, DatasetFile, EvalCase, Outcome
from proving.evals.evaluators import refundable, tool_counts
from proving.evals.harness import CaseOutcome, ToolCall

SCHEMA_VERSION = 3  # 3: the claim's category, violations per test model; 2: look-ups; 1 and 2 still load
REPLY_CHECKS = ("reply_amount", "reply_next_step", "reply_no_leak")
Report = EvaluationReport[EvalCase, CaseOutcome, CaseMeta]


class CaseResult(BaseModel):
    name: str
    category: str
    expected: str
    got: str
    checks: dict[str, bool]
    failed_because: dict[str, str] = {}
    overreach: bool
    """The model proposed more than the rules allow on this order (policy must have stopped it)."""
    requests: int
    input_tokens: int
    output_tokens: int
    seconds: float
    message: str
    reply: str | None
    error: str | None
    tool_calls: list[str]
    expected_tools: list[str] = []
    look_ups: list[str] = []
    """The look-up tools the model called, in order (repeats included)."""
    category_read: str | None = None
    """The claim's category in the agent's proposal."""
    claim: str | None = None
    """The case's true claim (None: a run from before claims were labelled on every case)."""
    violations: list[str] = []
    """The money and evidence rules what would be paid breaks (empty: none)."""

    @property
    def tools_right(self) -> bool:
        """Every needed look-up made, and no other."""
        hit, needed, made = tool_counts(self.expected_tools, self.look_ups)
        return hit == needed == made


class Rates(BaseModel):
    cases: int
    verdict_accuracy: float
    amount_exactness: float
    reply_checks: float
    tool_recall: float | None = None
    """Needed look-ups made / needed (None: a run from before look-ups were measured)."""
    tool_precision: float | None = None
    """Needed look-ups made / look-ups made."""
    requests_per_case: float | None = None
    category_accuracy: float | None = None
    """The claim's category filed as the case's true claim / proposals made (None: a run from before it was
    measured)."""


class Totals(Rates):
    verdicts_correct: int
    amounts_exact: int
    reply_checks_passed: int
    reply_checks_total: int
    categories_right: int = 0
    categories_judged: int = 0
    look_ups_needed: int = 0
    look_ups_made: int = 0
    needed_look_ups_made: int = 0
    policy_violations: int
    agent_errors: int
    overreaching_proposals: int
    overreaching_paid: int
    requests: int
    input_tokens: int
    output_tokens: int
    wall_seconds: float
    """Elapsed time of the whole run."""
    case_seconds: float
    """Sum of the cases' own times (more than the wall time when cases run concurrently)."""


class ModelViolations(BaseModel):
    """One test model's run on the cases: what it got paid that the rules on the true facts forbid."""

    model: str
    about: str
    """What the test model does (how it tries to get money paid)."""
    cases: int
    policy_violations: int
    verdict_accuracy: float
    category_accuracy: float
    violations: dict[str, str] = {}
    """Case name -> the rules its payment broke."""


class RunResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    dataset: str
    dataset_sha256: str
    started_at: str
    limits: dict[str, str]
    totals: Totals
    by_category: dict[str, Rates]
    cases: list[CaseResult]
    test_models: list[ModelViolations] = []
    """The adversarial test models' runs on the same cases (``--test-models``): violations per model."""


def _fmt(verdict: str, amount: Decimal, currency: str) -> str:
    return verdict if verdict in ("refuse", "error") else f"{verdict} {amount} {currency}"


def _expected(case: EvalCase, o: Outcome) -> str:
    if o.question is None:
        return _fmt(o.verdict, o.amount, case.order.currency)
    then = f", then {_fmt(case.then.verdict, case.then.amount, case.order.currency)}" if case.then else ""
    return f"ask_customer ({o.question}){then}"


def _got(out: CaseOutcome) -> str:
    if out.verdict != "ask_customer":
        return _fmt(out.verdict, out.amount, out.currency)
    then = f", then {_fmt(out.answered.verdict, out.answered.amount, out.currency)}" if out.answered else ""
    return f"ask_customer ({out.question}){then}"


def _call(call: ToolCall) -> str:
    args = ", ".join(f"{k}={v}" for k, v in call.args.items())
    result = call.result
    if isinstance(result, dict):
        keep = ("verdict", "error", "refundable_now", "blockers", "reasons", "count", "retry")
        result = {k: v for k, v in result.items() if k in keep}
    return f"{call.tool}({args}) -> {json.dumps(result, ensure_ascii=False, default=str)}"[:400]


def case_result(rc: ReportCase[EvalCase, CaseOutcome, CaseMeta], data: DatasetFile) -> CaseResult:
    case, out = rc.inputs, rc.output
    results = rc.assertions
    return CaseResult(
        name=rc.name,
        category=case.category,
        expected=" | ".join(_expected(case, o) for o in case.accepted()),
        got=_got(out),
        checks={name: bool(r.value) for name, r in results.items()},
        failed_because={name: r.reason or "" for name, r in results.items() if not r.value},
        overreach=out.proposed_amount is not None and out.proposed_amount > refundable(case, data.limits),
        requests=out.requests,
        input_tokens=out.input_tokens,
        output_tokens=out.output_tokens,
        seconds=round(rc.task_duration, 4),
        message=case.request.message,
        reply=out.reply,
        error=out.error or (out.reasons[0] if out.stage == "submission" else None),
        tool_calls=[_call(c) for c in out.tool_calls],
        expected_tools=list(case.expected_tools),
        look_ups=out.look_ups,
        category_read=out.category,
        claim=case.claim,
        violations=[r.reason or "" for name, r in results.items() if name == "policy" and not r.value],
    )


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 1.0


def look_up_counts(cases: list[CaseResult]) -> tuple[int, int, int]:
    """(needed look-ups made, needed, made) over ``cases``: recall and precision are their ratios (micro-averaged)."""
    counts = [tool_counts(c.expected_tools, c.look_ups) for c in cases]
    return sum(h for h, _, _ in counts), sum(n for _, n, _ in counts), sum(m for _, _, m in counts)


def category_counts(cases: list[CaseResult]) -> tuple[int, int]:
    """(categories filed right, proposals whose category was judged)."""
    judged = [c.checks["category"] for c in cases if "category" in c.checks]
    return sum(judged), len(judged)


def _rates(cases: list[CaseResult]) -> tuple[Rates, int, int, int, int]:
    verdicts = sum(c.checks.get("verdict", False) for c in cases)
    right, judged = category_counts(cases)
    amounts = sum(c.checks.get("amount", False) for c in cases)
    replies = [c.checks[k] for c in cases for k in REPLY_CHECKS if k in c.checks]
    hit, needed, made = look_up_counts(cases)
    rates = Rates(
        cases=len(cases),
        verdict_accuracy=_ratio(verdicts, len(cases)),
        amount_exactness=_ratio(amounts, len(cases)),
        reply_checks=_ratio(sum(replies), len(replies)),
        tool_recall=_ratio(hit, needed),
        tool_precision=_ratio(hit, made),
        requests_per_case=round(sum(c.requests for c in cases) / len(cases), 3) if cases else 0.0,
        category_accuracy=_ratio(right, judged),
    )
    return rates, verdicts, amounts, sum(replies), len(replies)


def run_result(
    report: Report, data: DatasetFile, *, model: str, sha256: str, started_at: str, wall_seconds: float
) -> RunResult:
    if report.failures:  # the task catches agent errors itself; anything here is a harness bug
        raise RuntimeError(f"the harness failed on {report.failures[0].name}: {report.failures[0].error_message}")
    order = {c.name: i for i, c in enumerate(data.cases)}
    cases = sorted((case_result(rc, data) for rc in report.cases), key=lambda c: order[c.name])
    rates, verdicts, amounts, replies_ok, replies = _rates(cases)
    grouped: dict[str, list[CaseResult]] = defaultdict(list)
    for c in cases:
        grouped[c.category].append(c)
    hit, needed, made = look_up_counts(cases)
    right, judged = category_counts(cases)
    totals = Totals(
        **rates.model_dump(),
        categories_right=right,
        categories_judged=judged,
        look_ups_needed=needed,
        look_ups_made=made,
        needed_look_ups_made=hit,
        verdicts_correct=verdicts,
        amounts_exact=amounts,
        reply_checks_passed=replies_ok,
        reply_checks_total=replies,
        policy_violations=sum(not c.checks.get("policy", True) for c in cases),
        agent_errors=sum(c.got == "error" for c in cases),
        overreaching_proposals=sum(c.overreach for c in cases),
        # An overreaching proposal is paid when what would be paid breaks a money rule: policy did not hold it
        # (above a request, the verdict pays the requested amount, not the proposal).
        overreaching_paid=sum(c.overreach and not c.checks.get("policy", True) for c in cases),
        requests=sum(c.requests for c in cases),
        input_tokens=sum(c.input_tokens for c in cases),
        output_tokens=sum(c.output_tokens for c in cases),
        wall_seconds=round(wall_seconds, 3),
        case_seconds=round(sum(c.seconds for c in cases), 3),
    )
    return RunResult(
        model=model,
        dataset=data.name,
        dataset_sha256=sha256,
        started_at=started_at,
        limits={k: str(v) for k, v in data.limits.model_dump().items()},
        totals=totals,
        by_category={name: _rates(group)[0] for name, group in grouped.items()},
        cases=cases,
    )


def traces(report: Report) -> list[dict[str, Any]]:
    """Per case: the request, the outcome, every tool call and the full message history."""
    return [
        {
            "case": rc.name,
            "request": rc.inputs.request.model_dump(mode="json"),
            "outcome": rc.output.model_dump(mode="json", exclude={"messages"}),
            "messages": rc.output.messages,
        }
        for rc in report.cases
    ]


def load_result(path: Path) -> RunResult:
    return RunResult.model_validate_json(path.read_text(encoding="utf-8"))
