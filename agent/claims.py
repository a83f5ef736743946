"""A claim and its evidence as people read them: the API's ``claim`` object, the console's lines, approvers' text.

Pure presentation of what the refund's row holds (``claim_category`` and ``evidence``, the checkpointed
look-ups as ``Evidence.model_dump(mode="json")``): no I/O, no decision. Ticket comments are the customer's
own words and never leave through the API; a ticket is shown by its subject, status and comment count.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ValidationError

from steps.evidence import Evidence, ReturnReceipt, RiskSignals, TicketHistory, Tracking
from steps.records import UnsupportedCurrencyError, format_money

log = logging.getLogger(__name__)

#: Each claim category in plain words (the categories are agent.domain's ``ClaimCategory``).
CLAIM_CATEGORIES: dict[str, str] = {
    "not_received": "not received",
    "damaged": "damaged",
    "returned": "returned",
    "wrong_item": "wrong item",
    "not_as_described": "not as described",
    "duplicate_charge": "duplicate charge",
    "changed_mind": "changed mind",
    "other": "other",
}
#: The look-ups by the names ``Evidence.failed`` uses, as a sentence starts with them.
LOOK_UPS: dict[str, str] = {
    "tracking": "Tracking",
    "returns": "The return",
    "risk": "Payment risk",
    "tickets": "Earlier tickets",
}
_TRACKING_STATUS = {
    "pre_transit": "not yet handed to the carrier",
    "in_transit": "in transit",
    "out_for_delivery": "out for delivery",
    "delivered": "delivered",
    "return_to_sender": "returned to sender",
    "failure": "delivery failed",
    "unknown": "status unknown",
}


def category_label(category: str | None) -> str | None:
    """The category in plain words; an unknown one as it is written, None as None."""
    return None if category is None else CLAIM_CATEGORIES.get(category, category.replace("_", " "))


def _when(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _day(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d")


def _money(amount: Decimal, currency: str) -> str:
    try:
        return format_money(amount, currency)
    except UnsupportedCurrencyError:  # a receipt without a currency: the amount as the warehouse wrote it
        return f"{amount} {currency}".strip()


def tracking_line(tracking: Tracking) -> str:
    head = f"Tracking ({tracking.carrier} {tracking.tracking_code})"
    if not tracking.found:
        return f"{head}: the carrier knows no shipment under this code"
    status = _TRACKING_STATUS.get(tracking.status, tracking.status)
    if tracking.status == "delivered" and tracking.delivered_at is not None:
        status += f" {_when(tracking.delivered_at)}"
    if tracking.signed_by:
        status += f", signed by {tracking.signed_by}"
    elif tracking.proof == "signature":
        status += ", signed for"
    elif tracking.proof == "photo":
        status += ", photo at the door"
    if tracking.status != "delivered" and tracking.est_delivery is not None:
        status += f", expected {_day(tracking.est_delivery)}"
    last = tracking.last_event
    if last is not None:
        status += f"; last event: {last.message}" + (f", {last.place}" if last.place else "")
    return f"{head}: {status}"


def return_line(receipt: ReturnReceipt) -> str:
    if receipt.status == "none":
        return "No return was opened for this order"
    stages = {
        "label_created": ("label created", receipt.label_created_at),
        "in_transit": ("on its way back, shipped", receipt.shipped_at),
        "received": ("received", receipt.received_at),
        "inspected": ("inspected, received", receipt.received_at),
    }
    stage, at = stages.get(receipt.status, (receipt.status, None))
    parts = [stage + (f" {_day(at)}" if at else "")]
    for line in receipt.lines:
        money = _money(line.amount, receipt.currency)
        got = "received" + (f" ({line.condition})" if line.condition != "unknown" else "")
        parts.append(f"{line.description} x{line.quantity} {money} {got if line.received else 'not received'}")
    return f"Return {receipt.rma_id or '(no RMA number)'}: " + "; ".join(parts)


def risk_line(risk: RiskSignals) -> str:
    parts = [f"early fraud warning {w.warning_id} ({w.fraud_type})" for w in risk.early_fraud_warnings]
    parts += [f"{'open ' if d.open else ''}dispute {d.dispute_id} ({d.reason}, {d.status})" for d in risk.disputes]
    return "Payment risk: " + ("; ".join(parts) or "none")


def tickets_line(history: TicketHistory) -> str:
    if not history.tickets:
        return "Earlier tickets: none"
    newest = history.tickets[0]
    return f"Earlier tickets: {len(history.tickets)} (newest: '{newest.subject}', {newest.status})"


def evidence_lines(evidence: Evidence | None) -> list[str]:
    """Short sentences a support person reads, one per look-up (and one per look-up that failed)."""
    if evidence is None:
        return []
    lines = []
    if evidence.tracking is not None:
        lines.append(tracking_line(evidence.tracking))
    if evidence.returns is not None:
        lines.append(return_line(evidence.returns))
    if evidence.risk is not None:
        lines.append(risk_line(evidence.risk))
    if evidence.tickets is not None:
        lines.append(tickets_line(evidence.tickets))
    order = list(LOOK_UPS)
    for name in sorted(evidence.failed, key=lambda n: (order.index(n) if n in order else len(order), n)):
        lines.append(f"{LOOK_UPS.get(name, name)} could not be read: {evidence.failed[name]}")
    return lines


def claim_text(category: str | None, evidence: list[str] | None) -> str:
    """The lines approvers' messages add below the reason (empty when there is neither)."""
    text = f"\nClaim: {_one_line(category_label(category) or '')}" if category else ""
    if evidence:
        text += "\nEvidence:" + "".join(f"\n- {_one_line(line)}" for line in evidence)
    return text


def _one_line(text: str) -> str:
    """Outside text (a ticket's subject, a carrier's event) kept on one line: it cannot start a line of its own,
    such as a second ``Decide:`` link in an approver's message."""
    return " ".join(text.split())


def stored_evidence(value: Any) -> Evidence | None:
    """The evidence a refund's row holds (its JSON); None for a refund from before evidence, or one unreadable."""
    if value is None:
        return None
    try:
        return Evidence.model_validate(value)
    except ValidationError as error:
        log.warning("a refund's recorded evidence does not read as evidence: %s", error.error_count())
        return None


class TicketView(BaseModel):
    """An earlier ticket without its comments: they are the customer's own words."""

    ticket_id: str
    subject: str
    status: str
    created_at: datetime
    comments: int
    """How many comments the ticket has."""


class TicketsView(BaseModel):
    count: int
    tickets: list[TicketView]
    """Newest first."""


class EvidenceView(BaseModel):
    """What the agent looked up (null: not looked up) and which look-ups failed (look-up -> what went wrong)."""

    tracking: Tracking | None
    returns: ReturnReceipt | None
    risk: RiskSignals | None
    tickets: TicketsView | None
    failed: dict[str, str]


class ClaimView(BaseModel):
    """The claim as the agent categorised it and the evidence behind it; all empty for older refunds."""

    category: str | None
    """One of not_received, damaged, returned, wrong_item, not_as_described, duplicate_charge, changed_mind,
    other; null before the agent named categories."""
    category_label: str | None
    evidence: EvidenceView | None
    summary: list[str]
    """The evidence as sentences a person reads (the console and approvers' messages show the same)."""


def evidence_view(evidence: Evidence) -> EvidenceView:
    tickets = evidence.tickets
    return EvidenceView(
        tracking=evidence.tracking,
        returns=evidence.returns,
        risk=evidence.risk,
        tickets=None
        if tickets is None
        else TicketsView(
            count=len(tickets.tickets),
            tickets=[
                TicketView(
                    ticket_id=t.ticket_id,
                    subject=t.subject,
                    status=t.status,
                    created_at=t.created_at,
                    comments=len(t.comments),
                )
                for t in tickets.tickets
            ],
        ),
        failed=dict(evidence.failed),
    )


def claim_view(category: str | None, evidence_json: Any) -> ClaimView:
    """The ``claim`` object of a refund's status, from its row's ``claim_category`` and ``evidence`` columns."""
    evidence = stored_evidence(evidence_json)
    return ClaimView(
        category=category,
        category_label=category_label(category),
        evidence=evidence_view(evidence) if evidence is not None else None,
        summary=evidence_lines(evidence),
    )
