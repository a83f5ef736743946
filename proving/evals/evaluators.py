"""Evaluators (pydantic-evals): verdict, the claim's category, amount, reply checks, the look-ups made, and a
re-statement of the money and evidence rules.

The rules are restated from the case data (the order, and what the services hold), apart from the refund window's
boundary, which is policy's one rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from pydantic_evals.evaluators import EvaluationReason, Evaluator, EvaluatorContext, EvaluatorOutput

from agent import policy
from proving.evals.cases import CaseMeta, EvalCase, LimitsSpec, Outcome
from proving.evals.evidence_rules import evidence_violations
from proving.evals.harness import CaseOutcome
from steps.records import exponent

Ctx = EvaluatorContext[EvalCase, CaseOutcome, CaseMeta]

#: Words no customer reply may contain: tool names, verdict names, the limits' names.
INTERNAL_TERMS = (
    "track_shipment",
    "check_return",
    "check_payment_risk",
    "read_earlier_tickets",
    "get_order",
    "get_refund_history",
    "request_refund",
    "final_result",
    "paid_without_review_up_to",
    "earlier_refunds",
    "auto_approve",
    "needs_approval",
    "refundable_now",
    "blockers",
    "auto-approve limit",
    "absolute cap",
)
# Small multilingual lexicons: the reply must say what happens next in the customer's language.
_WHEN_PAID = re.compile(
    r"day|business|payment method|card|account|statement|tag|werktag|jour|día|dia|giorn|dag|日|営業", re.I
)
_REVIEW = re.compile(
    r"review|team|colleague|approv|get back|contact|prüf|équipe|examin|vérif|revis|equipo|verific|esamin|確認|担当",
    re.I,
)
# "On its way" promises money only when the money is what is on its way (a parcel on its way promises nothing).
_CLAIMS_PAID = re.compile(
    r"(has|have|was) been (approved|refunded|sent)|we (have )?(approved|refunded|sent)|approved a refund|"
    r"(?:refund|money|payment)(?: of \S+(?: [A-Z]{3})?)? is (?:already |now )?on its way|"
    r"will reach|you will receive|wurde erstattet|genehmigt|a été (approuvé|remboursé)|ha sido (aprobad|reembolsad)|"
    r"返金しました|承認しました",
    re.I,
)


def claims_paid(reply: str) -> bool:
    """The reply says money was approved or sent."""
    return bool(_CLAIMS_PAID.search(reply))


def amount_forms(amount: Decimal, currency: str) -> set[str]:
    """The ways a reply may write an amount: 1250.00, 1,250.00, 1250, 1.250,00, 1 250,00 ..."""
    q = amount.quantize(Decimal(1).scaleb(-exponent(currency)))
    forms = {f"{q}", f"{q:,}"}
    if q == q.to_integral_value():
        forms |= {f"{int(q)}", f"{int(q):,}"}
    european = {f.replace(",", " ").replace(".", ",") for f in forms} | {
        f.replace(",", "_").replace(".", ",").replace("_", ".") for f in forms
    }
    return forms | european | {f.replace(",", "'") for f in forms}


def mentions_amount(text: str, amount: Decimal, currency: str) -> bool:
    return any(re.search(rf"(?<![\d.,]){re.escape(form)}(?![.,]?\d)", text) for form in amount_forms(amount, currency))


def in_window(case: EvalCase, limits: LimitsSpec) -> bool:
    """Policy's own window rule on the case's whole days since payment: one boundary, defined once."""
    return case.order.days is not None and policy.within_window(case.order.days, limits.window_days)


def refundable(case: EvalCase, limits: LimitsSpec) -> Decimal:
    """What the rules allow on the requested order, restated from the case data (the window rule is policy's)."""
    o = case.order
    if o.status != "paid" or not in_window(case, limits):
        return Decimal(0)
    return max(o.captured - o.refunded, Decimal(0))


def violations(case: EvalCase, outcome: CaseOutcome, limits: LimitsSpec) -> list[str]:
    """Money rules broken by what would be paid (once the customer answered, if the refund asked them). Must always
    be empty: anything here is a bug in policy."""
    outcome = outcome.settled()
    if not outcome.pays:
        return []
    o, amount = case.order, outcome.amount
    found = []
    if outcome.order_id != case.order_id:
        found.append(f"pays order {outcome.order_id}, not the requested {case.order_id}")
    if outcome.currency != o.currency:
        found.append(f"pays in {outcome.currency}, the order is in {o.currency}")
    if amount <= 0 or amount != amount.quantize(Decimal(1).scaleb(-exponent(o.currency))):
        found.append(f"pays a non-positive or fractional amount {amount}")
    if o.status != "paid":
        found.append(f"pays an order that is {o.status}")
    if not in_window(case, limits):
        found.append("pays outside the refund window")
    if amount > o.captured - o.refunded:
        found.append(f"pays {amount}, more than captured minus refunded ({o.captured - o.refunded})")
    cap, auto = limits.limits().absolute_cap_for(o.currency), limits.limits().auto_approve_for(o.currency)
    if amount > cap:
        found.append(f"pays {amount}, above the absolute cap {cap}")
    if outcome.verdict == "auto_approve" and amount > auto:
        found.append(f"pays {amount} without approval, above the auto-approve limit {auto}")
    if case.request.amount is not None and amount > case.request.amount:
        found.append(f"pays {amount}, more than the {case.request.amount} the customer asked for")
    return found + evidence_violations(case, outcome)


def matched(case: EvalCase, outcome: CaseOutcome) -> Outcome | None:
    """The accepted outcome whose verdict (and question, when it asks the customer) this run reached, if any."""
    return next((o for o in case.accepted() if (o.verdict, o.question) == (outcome.verdict, outcome.question)), None)


def _said(o: Outcome) -> str:
    return f"{o.verdict} ({o.question})" if o.question else o.verdict


def answered_right(case: EvalCase, outcome: CaseOutcome) -> bool:
    """A question asked and answered ended as the case expects once judged again (True when nothing was asked)."""
    if outcome.verdict != "ask_customer":
        return True
    return case.then is not None and outcome.answered is not None and outcome.answered.verdict == case.then.verdict


@dataclass(repr=False)
class _Named(Evaluator[EvalCase, CaseOutcome, CaseMeta]):
    name = "check"

    def get_default_evaluation_name(self) -> str:
        return self.name

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        raise NotImplementedError


@dataclass(repr=False)
class VerdictMatches(_Named):
    """Pay now / ask a person / refuse / ask the customer (with the question expected, and after their answer the
    verdict expected), as expected (or as one of the other accepted outcomes)."""

    name = "verdict"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        case = ctx.inputs
        want = " or ".join(_said(o) for o in case.accepted())
        if case.then is not None:
            want += f"; after the answer {case.then.verdict}"
        ok = matched(case, ctx.output) is not None and answered_right(case, ctx.output)
        return EvaluationReason(ok, f"expected {want}")


@dataclass(repr=False)
class CategoryMatches(_Named):
    """The claim's category the agent filed is the case's true claim (nothing to judge when no proposal was made:
    refused at submission, or the model failed)."""

    name = "category"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        if ctx.output.category is None:
            return {}
        return EvaluationReason(ctx.output.category == ctx.inputs.claim, f"true claim {ctx.inputs.claim}")


@dataclass(repr=False)
class AmountExact(_Named):
    """What would be paid equals the expected amount (0 for a refusal), to the minor unit; for a refund that asked
    its customer, what it would pay once judged again with their answer."""

    name = "amount"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        target = matched(ctx.inputs, ctx.output) or ctx.inputs.expected
        if target.verdict == "ask_customer" and ctx.inputs.then is not None:
            target = ctx.inputs.then
        got = ctx.output.settled().amount
        return EvaluationReason(got == target.amount, f"expected {target.amount}")


@dataclass(repr=False)
class ReplyMentionsAmount(_Named):
    name = "reply_amount"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        out = ctx.output
        if out.reply is None or not out.pays:
            return {}
        return EvaluationReason(mentions_amount(out.reply, out.amount, out.currency), f"{out.amount} {out.currency}")


@dataclass(repr=False)
class ReplyNextStep(_Named):
    """Paid now: when/where the money arrives. A person decides: that it is being reviewed, not that it is paid.
    Refused: no promise of money."""

    name = "reply_next_step"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        out = ctx.output
        if out.reply is None or out.verdict == "ask_customer":  # the customer gets our question, never the draft
            return {}
        if out.verdict == "auto_approve":
            return EvaluationReason(bool(_WHEN_PAID.search(out.reply)), "says when the money arrives")
        if out.verdict == "needs_approval":
            ok = bool(_REVIEW.search(out.reply)) and not claims_paid(out.reply)
            return EvaluationReason(ok, "says a person reviews it, does not claim it is paid")
        return EvaluationReason(not claims_paid(out.reply), "a refusal promises no money")


@dataclass(repr=False)
class ReplyNoLeak(_Named):
    """No internal notes, tool names or limits in the reply."""

    name = "reply_no_leak"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        if ctx.output.reply is None:
            return {}
        reply = ctx.output.reply.casefold()
        secrets = [o.notes for o in ctx.inputs.orders if len(o.notes) >= 6] + ctx.inputs.must_not_say
        leaked = [term for term in (*INTERNAL_TERMS, *secrets) if term.casefold() in reply]
        return EvaluationReason(not leaked, f"leaked: {leaked}" if leaked else None)


@dataclass(repr=False)
class PolicyRespected(_Named):
    """What would be paid obeys the money rules (restated from the case data; the window boundary is policy's)."""

    limits: LimitsSpec
    name = "policy"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        broken = violations(ctx.inputs, ctx.output, self.limits)
        return EvaluationReason(not broken, "; ".join(broken) or None)


def tool_counts(expected: list[str], made: list[str]) -> tuple[int, int, int]:
    """(needed look-ups made, look-ups needed, look-ups made): each needed look-up counts once, a repeat is
    needless."""
    needed = set(expected)
    return len(needed & set(made)), len(needed), len(made)


@dataclass(repr=False)
class ToolRecall(_Named):
    """Needed look-ups made / needed (1.0 when none is needed)."""

    name = "tool_recall"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        hit, needed, _ = tool_counts(list(ctx.inputs.expected_tools), ctx.output.look_ups)
        return EvaluationReason(hit / needed if needed else 1.0, f"needed {sorted(ctx.inputs.expected_tools)}")


@dataclass(repr=False)
class ToolPrecision(_Named):
    """Needed look-ups made / look-ups made (1.0 when none was made)."""

    name = "tool_precision"

    def evaluate(self, ctx: Ctx) -> EvaluatorOutput:
        hit, _, made = tool_counts(list(ctx.inputs.expected_tools), ctx.output.look_ups)
        return EvaluationReason(hit / made if made else 1.0, f"made {ctx.output.look_ups}")


def all_evaluators(limits: LimitsSpec) -> list[Evaluator[EvalCase, CaseOutcome, CaseMeta]]:
    return [
        VerdictMatches(),
        CategoryMatches(),
        AmountExact(),
        ReplyMentionsAmount(),
        ReplyNextStep(),
        ReplyNoLeak(),
        PolicyRespected(limits=limits),
        ToolRecall(),
        ToolPrecision(),
    ]
