"""The checks a person's decision passes before it is recorded: who may decide, which amount, in which currency.

An approver may approve less than a refund asks (more than 0, whole minor units of its currency), never more;
a rejection is of the amount asked. ``agent.approvals.decide`` runs ``check`` before it records anything, and
the console's confirmation runs it before it asks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

from agent.domain import ApprovalRecord
from agent.identity import Principal
from steps.approval_book import approval_request, recorded_decision
from steps.records import ApprovalRequest, format_money, minor_unit_problem, quantize
from steps.refunds import refund_requester
from steps.store import app_db

Decision = Literal["approve", "reject"]


class ApprovalError(Exception):
    """A decision that cannot be taken; ``code`` says why (the HTTP layer maps it to a status)."""

    def __init__(self, code: str, message: str, recorded: ApprovalRecord | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.recorded = recorded


def authority_refusal(
    approver: Principal, amount: Decimal, currency: str, limits: Mapping[str, Mapping[str, Decimal]]
) -> str | None:
    """Why ``approver`` may not approve ``amount``, or None. The principal's own limit applies, and so does the
    limit of the operator it acts for (a person's limit holds through every client and command line acting for
    them). A principal without a limit, acting for nobody with one, is not limited."""
    holders = [str(approver)]
    if approver.person is not None and approver.kind != "operator":
        holders.append(str(Principal("operator", approver.person)))
    for holder in holders:
        mine = limits.get(holder)
        if mine is None:
            continue
        most = mine.get(currency)
        if most is None:
            return f"{_as(approver, holder)} has no approval authority in {currency}"
        if amount > most:
            most_text, approving = format_money(most, currency), format_money(amount, currency)
            return f"{_as(approver, holder)} may approve up to {most_text}; this approval is for {approving}"
    return None


def _as(approver: Principal, holder: str) -> str:
    return str(approver) if holder == str(approver) else f"{approver} (acting for {holder})"


def parse_amount(text: str) -> Decimal:
    """An amount typed into a form, as a number; ``amount_refusal`` judges it against the request."""
    try:
        amount = Decimal(text.strip())
    except ArithmeticError:
        raise ApprovalError("invalid", f"{text!r} is not an amount") from None
    if not amount.is_finite():
        raise ApprovalError("invalid", f"{text!r} is not an amount")
    return amount


def amount_refusal(
    request: ApprovalRequest, decision: Decision, amount: Decimal, currency: str
) -> ApprovalError | None:
    """Why a decision for ``amount`` cannot answer ``request``, or None. An approval may be for less than asked
    (more than 0, whole minor units of the refund's currency), never more; a rejection is of the amount asked."""
    asked = format_money(request.amount, request.currency)
    if currency != request.currency:
        return ApprovalError("mismatch", f"the decision is in {currency} but the refund awaits {asked}")
    if decision == "reject" and amount != request.amount:
        return ApprovalError("mismatch", f"the rejection is for {amount} {currency} but the refund awaits {asked}")
    if amount <= 0:
        return ApprovalError("invalid", f"an approval must be for more than 0 {currency}")
    if quantize(amount, currency) != amount:
        return ApprovalError("invalid", f"{amount} is not a whole number of {currency} minor units")
    if problem := minor_unit_problem(amount, currency):  # what the provider would refuse (KWD in 0.010 steps)
        return ApprovalError("invalid", problem)
    if amount > request.amount:
        approving = format_money(amount, currency)
        return ApprovalError("above_ask", f"{approving} is more than the {asked} refund {request.refund_id} awaits")
    return None


def requester_refusal(
    refund_id: str, approver: Principal, requested_by: str | None, requester_operator: str | None
) -> str | None:
    """Why ``approver`` may not decide this refund because it asked for it, or None (separation of duties, per
    person: the principal that asked, the operator it acted for, and every client or OS user acting for that
    operator are one requester)."""
    if requested_by is not None and str(approver) == requested_by:
        return f"{approver} requested refund {refund_id}; the requester cannot decide it"
    if is_requester(approver, requested_by, requester_operator):
        acting = "" if approver.kind == "operator" else f" (acting for operator:{approver.person})"
        return (
            f"{approver}{acting} is the person who requested refund {refund_id} "
            f"(through {requested_by}); the requester cannot decide it"
        )
    return None


def decider_refusal(refund_id: str, approver: Principal, deciders: Collection[str] | None) -> ApprovalError | None:
    """Why ``approver`` may not decide refund ``refund_id`` whatever the decision says, or None: it acts for an
    operator who may not decide, the refund does not exist, or it requested the refund. The API checks this before
    it reads the decision's body, so the requester hears 403 (and an unknown refund 404) whatever it sent."""
    if refused := deciding_refusal(approver, deciders):
        return ApprovalError("not_a_decider", refused)
    with app_db().engine.connect() as conn:
        requester = refund_requester(conn, refund_id)
    if requester is None:
        return ApprovalError("unknown", f"there is no refund {refund_id}")
    if refused := requester_refusal(refund_id, approver, *requester):
        return ApprovalError("requester", refused)
    return None


def is_requester(approver: Principal, requested_by: str | None, requester_operator: str | None) -> bool:
    """Whether ``approver`` is the refund's requester: the same principal, or the same person (the operator the
    requester acted for, or the requesting operator itself)."""
    if requested_by is not None and str(approver) == requested_by:
        return True
    persons = {requester_operator} if requester_operator else set()
    kind, _, name = (requested_by or "").partition(":")
    if kind == "operator":
        persons.add(name)
    return approver.person is not None and approver.person in persons


def deciding_refusal(approver: Principal, deciders: Collection[str] | None) -> str | None:
    """Why ``approver``, acting for an operator, may not decide at all, or None: a client or an OS user acting for
    an operator decides only while that operator may (configured, role approver or admin: ``deciders``). An
    operator's own channels (console session, link, Slack) establish that themselves; None for ``deciders``:
    not checked."""
    if deciders is None or approver.kind == "operator" or approver.person is None or approver.person in deciders:
        return None
    return f"{approver} acts for operator:{approver.person}, who may not decide refunds"


@dataclass(frozen=True)
class Checked:
    """What a decision would answer: the request, the amount it would record, and the decision already standing."""

    request: ApprovalRequest
    amount: Decimal
    standing: ApprovalRecord | None


def check(
    *,
    refund_id: str,
    decision: Decision,
    approver: Principal,
    amount: Decimal | None,
    currency: str,
    asked: Decimal | None = None,
    authority: Mapping[str, Mapping[str, Decimal]] | None = None,
    deciders: Collection[str] | None = None,
    now: datetime | None = None,
) -> Checked:
    """Every check a decision passes before it is recorded (``decide``); the console's confirmation runs them
    before it asks. Raises ``ApprovalError`` for a decision that cannot be taken. ``deciders``: the operators who
    may decide now (``agent.identity.approver_names``), for a principal acting for one."""
    now = now or datetime.now(UTC)
    if refused := deciding_refusal(approver, deciders):
        raise ApprovalError("not_a_decider", refused)
    with app_db().engine.connect() as conn:
        existing = recorded_decision(conn, refund_id)
        request = approval_request(conn, refund_id)
        unknown = request is None and refund_requester(conn, refund_id) is None
    if unknown:
        raise ApprovalError("unknown", f"there is no refund {refund_id}")
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    if refused := requester_refusal(refund_id, approver, request.requested_by, request.requester_operator):
        raise ApprovalError("requester", refused)
    if existing is not None and existing.decision == "expired":
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed", existing)
    if existing is not None:  # recorded by the refund's decision workflow, which also hands it over
        return Checked(request, existing.amount, existing)
    if asked is not None and asked != request.amount:
        awaited = format_money(request.amount, request.currency)
        raise ApprovalError("mismatch", f"the page showed {asked} {currency} but the refund awaits {awaited}")
    amount = request.amount if amount is None else amount
    if refused_amount := amount_refusal(request, decision, amount, currency):
        raise refused_amount
    amount = quantize(amount, currency)  # 4200.000 USD is recorded as 4200.00
    if decision == "approve" and (refused := authority_refusal(approver, amount, currency, authority or {})):
        raise ApprovalError("authority", refused)
    if now >= request.expires_at:
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed")
    return Checked(request, amount, None)
