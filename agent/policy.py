"""Money rules: pure functions of an order, an amount, a time and the limits. No I/O, no model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from agent import evidence_policy
from agent.claim_reading import Read
from agent.domain import ClaimCategory, Verdict, VerdictKind
from steps.evidence import Evidence, LookUp
from steps.records import LIMIT_SCALES, Order, PastRefund, format_money, minor_unit_problem, quantize, supported

ZERO = Decimal(0)


@dataclass(frozen=True)
class Limits:
    """The money limits. ``auto_approve``, ``absolute_cap`` and ``customer_max_amount`` are in the base currency
    (USD) and count in another currency times its scale (``scales``, rounded to its minor unit), unless that
    currency has its own limit (the ``..._by_currency`` mappings)."""

    auto_approve: Decimal
    absolute_cap: Decimal
    window_days: int
    auto_approve_by_currency: Mapping[str, Decimal] = field(default_factory=dict)
    absolute_cap_by_currency: Mapping[str, Decimal] = field(default_factory=dict)
    customer_window_days: int = 30
    """The rolling window in which one customer's refunds are counted."""
    customer_max_refunds: int = 3
    """More refunds than this for one customer inside the window: a person decides, however small."""
    customer_max_amount: Decimal = Decimal("500.00")
    """More money than this (in the refund's currency) for one customer inside the window: a person decides."""
    customer_max_amount_by_currency: Mapping[str, Decimal] = field(default_factory=dict)
    order_max_open_claims: int = 1
    """Claims open on one order at once; a claim after this many goes to a person (raised only for load tests)."""
    scales: Mapping[str, Decimal] = field(default_factory=lambda: dict(LIMIT_SCALES))
    """Units of each currency per base-currency unit of a limit; a currency not listed counts one for one."""
    questions: frozenset[str] = frozenset()
    """What a refund may ask its customer for where only they can close the gap (``CUSTOMER_QUESTIONS``: delivery,
    photo, return_tracking); empty: nothing is asked, and such a gap goes to a person or is refused for now."""

    def auto_approve_for(self, currency: str) -> Decimal:
        return self._in(currency, self.auto_approve, self.auto_approve_by_currency)

    def absolute_cap_for(self, currency: str) -> Decimal:
        return self._in(currency, self.absolute_cap, self.absolute_cap_by_currency)

    def customer_max_amount_for(self, currency: str) -> Decimal:
        return self._in(currency, self.customer_max_amount, self.customer_max_amount_by_currency)

    def _in(self, currency: str, base: Decimal, own: Mapping[str, Decimal]) -> Decimal:
        if currency in own:
            return own[currency]
        scaled = base * self.scales.get(currency, Decimal(1))
        return quantize(scaled, currency) if supported(currency) else scaled


@dataclass(frozen=True)
class Claim:
    """What the refund claims and what was found about it: the agent's category, what the customer's words claim
    (agent.claim_reading), the look-ups' step outputs and the customer's earlier refunds as the case file's step
    read them."""

    category: ClaimCategory
    evidence: Evidence = field(default_factory=Evidence)
    history: Sequence[PastRefund] = ()
    """The claimant's refunds: the order's customer's and those of customer ids sharing its email, address or card."""
    refund_id: str = ""
    """This refund, left out of its customer's history."""
    words: frozenset[Read] = frozenset()
    """The categories the customer's words name; empty: none the reader knows (the agent's category stands)."""
    by_label: bool = False
    """Judged as refunds were before the whole case counted: the agent's category and its one look-up, and no
    reading of the words (only refunds recorded that way replay so, agent/workflow.py)."""

    @property
    def categories(self) -> frozenset[str]:
        """Every category the claim has: the agent's (unless ``other``, which names none) and the words'."""
        return frozenset({*self.words, self.category} - {"other"})

    @property
    def disagreement(self) -> str | None:
        """Why the agent's category and the customer's words disagree, or None."""
        if self.category == "other" or not self.words or self.category in self.words:
            return None
        said = ", ".join(sorted(w.replace("_", " ") for w in self.words))
        return f"the agent filed the claim as {self.category.replace('_', ' ')}, but the customer's words say {said}"

    open_claims: Sequence[PastRefund] = ()
    """The order's refunds that have not ended, this one among them (the case file's ``open_claims``)."""
    outside: Sequence[PastRefund] = ()
    """Refunds the payment provider made on the claimant's charges outside this service."""
    charges: Mapping[str, str] = field(default_factory=dict)
    """The claimant's charges (charge id -> order id) where the workflow reads ``outside``; policy does not."""


#: Refunds that paid nothing and never will: not counted against a customer.
_ENDED_UNPAID = frozenset({"rejected", "failed", "cancelled"})


def days_since_payment(paid_at: datetime, as_of: datetime) -> int:
    """Whole days elapsed since payment: 60 days and 23 hours after it is day 60."""
    return (as_of - paid_at).days


def within_window(days_since_payment: int, window_days: int) -> bool:
    """The refund window's one rule: an order is refundable through the whole of day ``window_days``."""
    return days_since_payment <= window_days


def _in_window(order: Order, as_of: datetime, window_days: int) -> bool:
    return order.paid_at is not None and within_window(days_since_payment(order.paid_at, as_of), window_days)


def refundable(order: Order, as_of: datetime, window_days: int) -> Decimal:
    """What may still be refunded on this order now: 0 unless paid, undisputed and inside the window."""
    if order.status != "paid" or not _in_window(order, as_of, window_days):
        return ZERO
    return max(order.remaining, ZERO)


def blockers(order: Order, as_of: datetime, window_days: int) -> list[str]:
    if order.status == "disputed":
        return ["the order is disputed; refunds go through the dispute"]
    if order.status != "paid" or order.paid_at is None:
        return ["the order is not paid"]
    if not _in_window(order, as_of, window_days):
        return [f"the order is outside the {window_days}-day refund window"]
    if order.remaining <= 0:
        return ["the order is already fully refunded"]
    return []


def decide(
    *,
    amount: Decimal,
    currency: str,
    order: Order,
    as_of: datetime,
    limits: Limits,
    requested: Decimal | None = None,
    claim: Claim | None = None,
) -> Verdict:
    """Pay now, ask a person, or refuse: the money rules (``_decide``), then what the claim's recorded evidence and
    the customer's recent refunds say (None: judged on the money rules alone, as refunds before evidence were)."""
    verdict = _decide(amount=amount, currency=currency, order=order, as_of=as_of, limits=limits, requested=requested)
    return verdict if claim is None else _with_claim(verdict, claim, order, as_of, limits, proposed=amount)


def _decide(
    *,
    amount: Decimal,
    currency: str,
    order: Order,
    as_of: datetime,
    limits: Limits,
    requested: Decimal | None = None,
) -> Verdict:
    """Pay now, ask a person, or refuse the model's ``amount``, bounded by what the customer asked for.

    ``requested`` is the customer's amount (None: they named none, and the bound is what is refundable).
    The model's amount is advice: above ``requested`` nothing more is ever paid. The refund goes to a person
    for the requested amount (never paid at once), with both amounts in the reasons, and the usual rules
    judge the requested amount (more than is refundable or above the cap: refused)."""
    if requested is not None and amount > requested:
        bounded = _judge(requested, currency, order, as_of, limits)
        asked = _money(requested, order.currency)  # the request is in the order's currency (agent.submit)
        over = f"the agent proposed {_money(amount, currency)}, more than the {asked} the customer asked for"
        kind: VerdictKind = "refuse" if bounded.kind == "refuse" else "needs_approval"
        return bounded.model_copy(update={"kind": kind, "reasons": (over, *bounded.reasons), "requested": requested})
    return _judge(amount, currency, order, as_of, limits).model_copy(update={"requested": requested})


def recheck(
    *,
    amount: Decimal,
    currency: str,
    order: Order,
    as_of: datetime,
    limits: Limits,
    requested: Decimal | None = None,
) -> Verdict:
    """Right before paying, on the order as reserved: the same rules, and never more than the customer asked for."""
    if requested is not None and amount > requested:
        asked = _money(requested, order.currency)
        reason = f"amount {_money(amount, currency)} is more than the {asked} the customer asked for"
        return Verdict(kind="refuse", amount=amount, currency=currency, reasons=(reason,), requested=requested)
    return decide(amount=amount, currency=currency, order=order, as_of=as_of, limits=limits, requested=requested)


def _money(amount: Decimal, currency: str) -> str:
    """An amount as people read it (4,200.00 USD, 15,000 JPY, 1.250 KWD); as given when it is not a whole number
    of the currency's minor units (so a reason never rounds away what was wrong with it)."""
    if supported(currency) and quantize(amount, currency) == amount:
        return format_money(amount, currency)
    return f"{amount} {currency}"


def _judge(amount: Decimal, currency: str, order: Order, as_of: datetime, limits: Limits) -> Verdict:
    """The rules on one amount: the order's state, its currency, what is refundable, the cap and the limit."""
    room = refundable(order, as_of, limits.window_days)
    reasons = blockers(order, as_of, limits.window_days)
    if currency != order.currency:
        reasons.append(f"currency {currency} does not match the order's {order.currency}")
    if amount <= 0:
        reasons.append("no refund amount was proposed")
    elif supported(order.currency) and (problem := minor_unit_problem(amount, order.currency)):
        reasons.append(problem)
    shown = _money(amount, currency)
    if amount > room and not reasons:
        reasons.append(f"amount {shown} exceeds the refundable {_money(room, order.currency)}")
    cap = limits.absolute_cap_for(currency)
    if amount > cap:
        reasons.append(f"amount {shown} is above the absolute cap of {_money(cap, currency)}")
    if reasons:
        return Verdict(kind="refuse", amount=amount, currency=currency, reasons=tuple(reasons), refundable=room)
    auto = limits.auto_approve_for(currency)
    if amount > auto:
        return Verdict(
            kind="needs_approval",
            amount=amount,
            currency=currency,
            reasons=(f"amount is above the auto-approve limit of {_money(auto, currency)}",),
            refundable=room,
        )
    return Verdict(kind="auto_approve", amount=amount, currency=currency, refundable=room)


def look_ups_wanted(
    *,
    amount: Decimal,
    currency: str,
    order: Order,
    as_of: datetime,
    limits: Limits,
    requested: Decimal | None,
    claim: Claim,
) -> tuple[LookUp, ...]:
    """What policy needs looked up before it can judge this claim and that was neither made nor tried: what the
    claim's categories need on this order, then, for a refund that would be paid at once, the charge's disputes
    and fraud warnings. Empty for a claim judged by its label (``by_label``)."""
    if claim.by_label:
        return ()
    tried = {*claim.evidence.looked_up(), *claim.evidence.failed}
    missing = tuple(n for n in evidence_policy.needed(claim.categories, order) if n not in tried)
    if missing or "risk" in tried or not order.charge_id:
        return missing
    verdict = _decide(amount=amount, currency=currency, order=order, as_of=as_of, limits=limits, requested=requested)
    verdict = _with_claim(verdict, claim, order, as_of, limits, proposed=amount, check_risk=False)
    return ("risk",) if verdict.kind == "auto_approve" else ()


def _with_claim(
    verdict: Verdict,
    claim: Claim,
    order: Order,
    as_of: datetime,
    limits: Limits,
    *,
    proposed: Decimal,
    check_risk: bool = True,
) -> Verdict:
    """The evidence can only lower what is paid or hand it to a person, never raise it: a refusal stands, and a
    proposal above the customer's request still goes to a person at the lower amount. Nothing is paid at once
    on a charge whose disputes and fraud warnings were not read (``check_risk``)."""
    if claim.by_label:
        found = evidence_policy.judge(claim.category, claim.evidence, order, as_of)
    else:
        found = evidence_policy.judge_case(claim.categories, claim.evidence, order, as_of, ask=limits.questions)
        if disagreement := claim.disagreement:
            if found.kind == "ask":  # a claim the model misread is not put to the customer: judged as it was before
                found = evidence_policy.judge_case(claim.categories, claim.evidence, order, as_of)
            if found.kind in ("none", "person"):
                found = replace(found, kind="person", reasons=(disagreement, *found.reasons))
    verdict = verdict.model_copy(update={"findings": found.facts, "flags": found.flags})
    if verdict.kind == "refuse":
        return verdict
    if found.kind in ("refuse", "wait"):
        return verdict.model_copy(
            update={"kind": "refuse", "reasons": found.reasons, "customer_note": found.customer_note}
        )
    if found.bound is not None and verdict.amount > found.bound:
        bound = f"limited to the lines the warehouse received: {_money(found.bound, order.currency)}"
        judged = _judge(found.bound, verdict.currency, order, as_of, limits)
        kind = judged.kind
        over = verdict.requested is not None and proposed > verdict.requested
        if over and kind == "auto_approve":  # the model asked for more than the customer: a person, always
            kind = "needs_approval"
        reasons = (*verdict.reasons[:1], bound, *judged.reasons) if over else (bound, *judged.reasons)
        verdict = verdict.model_copy(update={"kind": kind, "amount": found.bound, "reasons": reasons})
        if verdict.kind == "refuse":
            return verdict
    if found.kind == "ask":  # what only the customer can give first; their answer is judged by these same rules
        reasons = (*found.reasons, *(r for r in verdict.reasons if verdict.kind == "needs_approval"))
        return verdict.model_copy(update={"kind": "ask_customer", "reasons": reasons, "question": found.question})
    if found.kind == "person":
        reasons = (*found.reasons, *(r for r in verdict.reasons if verdict.kind == "needs_approval"))
        return verdict.model_copy(update={"kind": "needs_approval", "reasons": reasons})
    if verdict.kind == "auto_approve":
        serial = _serial_claimant(verdict, claim, as_of, limits)
        if serial:
            return verdict.model_copy(update={"kind": "needs_approval", "reasons": (serial,)})
    if verdict.kind == "auto_approve" and check_risk and not claim.by_label and (unread := _risk_unread(claim, order)):
        return verdict.model_copy(update={"kind": "needs_approval", "reasons": (unread,)})
    return verdict


def _risk_unread(claim: Claim, order: Order) -> str | None:
    """Why the charge's disputes and fraud warnings are not known for a refund about to be paid at once, or None."""
    if not order.charge_id or claim.evidence.risk is not None:
        return None
    if "risk" in claim.evidence.failed:
        return f"the charge's disputes and fraud warnings could not be read ({claim.evidence.failed['risk']})"
    return "the charge's disputes and fraud warnings were not read"


def _serial_claimant(verdict: Verdict, claim: Claim, as_of: datetime, limits: Limits) -> str | None:
    """Why this refund needs a person's eye however small, or None: another claim on its order is open, or the
    claimant's refunds inside the rolling window (across their linked customer ids, and those the payment
    provider made outside this service) are too many or too much."""
    return _open_claim(claim, limits) or _repeat_claimant(verdict, claim, as_of, limits)


def _open_claim(claim: Claim, limits: Limits) -> str | None:
    """Why this claim waits for the order's open one (named, with how it was filed, so the approver reads both)."""
    ahead = _open_claims_ahead(claim)
    if len(ahead) < limits.order_max_open_claims:
        return None
    first = ahead[0]
    filed = f", claimed as {first.claim_category}" if first.claim_category else ""
    return (
        f"refund {first.refund_id} of this order is still open ({first.status.replace('_', ' ')}{filed}): a second "
        "claim on one order goes to a person with the first, never paid on its own"
    )


def _repeat_claimant(verdict: Verdict, claim: Claim, as_of: datetime, limits: Limits) -> str | None:
    """Too many refunds, or too much money, for the claimant inside the rolling window."""
    since = as_of - timedelta(days=limits.customer_window_days)
    seen: set[str] = set()
    recent: list[PastRefund] = []
    for h in (*claim.history, *claim.outside):
        if h.refund_id in seen or h.refund_id == claim.refund_id:
            continue
        seen.add(h.refund_id)
        if h.created_at >= since and h.status not in _ENDED_UNPAID:
            recent.append(h)
    window = f"in the last {limits.customer_window_days} days"
    counted = _counted_from(recent)
    if len(recent) + 1 > limits.customer_max_refunds:
        limit = limits.customer_max_refunds
        return (
            f"this would be the customer's refund number {len(recent) + 1} {window} (at most {limit} without "
            f"review){counted}"
        )
    spent = sum((h.amount for h in recent if h.currency == verdict.currency), Decimal(0))
    cap = limits.customer_max_amount_for(verdict.currency)
    if spent + verdict.amount > cap:
        total = _money(spent + verdict.amount, verdict.currency)
        return f"the customer's refunds {window} would total {total}, above {_money(cap, verdict.currency)}{counted}"
    return None


#: The phases in which a refund is moving money: such a claim holds its order whenever it was made.
_MOVING_MONEY = frozenset({"paying", "settling"})
#: A refund in one of these has ended; any other phase is an open claim on its order.
_ENDED = frozenset({"completed", *_ENDED_UNPAID})


def _open_claims_ahead(claim: Claim) -> list[PastRefund]:
    """The order's open claims this refund comes after, oldest first: those made before it that have not ended, and
    those moving money. A later claim still deciding or waiting does not hold back an earlier one (it waits for a
    person itself)."""
    mine = next((c for c in claim.open_claims if c.refund_id == claim.refund_id), None)
    ahead: list[PastRefund] = []
    for other in claim.open_claims:
        if other.refund_id == claim.refund_id or other.status in _ENDED:
            continue
        earlier = mine is None or (other.created_at, other.refund_id) < (mine.created_at, mine.refund_id)
        if earlier or other.status in _MOVING_MONEY:
            ahead.append(other)
    return ahead


def _counted_from(recent: Sequence[PastRefund]) -> str:
    """Where the counted refunds came from, when not all are the order's customer's own with this service."""
    outside = sum(1 for h in recent if h.outside)
    linked = sorted({h.linked_by for h in recent if h.linked_by})
    parts = [f"{outside} made at the payment provider outside this service"] if outside else []
    if linked:
        shared = " or ".join(linked)
        parts.append(f"{sum(1 for h in recent if h.linked_by)} under another customer id with the same {shared}")
    return f", counting {' and '.join(parts)}" if parts else ""
