"""A refund's phase as a support lead speaks of it, read from the refund's row and its approval record.

The refund's row (``refunds.status``, written by the steps) and the approval decision say where the refund
stands; the DBOS workflows that carry it (a deciding run that ended SUCCESS while the refund waits for a
person, timers, forks) are detail, shown one click away.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    meaning: str


PHASES: dict[str, Phase] = {
    p.key: p
    for p in (
        Phase("deciding", "Deciding", "The agent is reading the request and policy is checking it."),
        Phase("parked", "Waiting for a person", "Parked until an approver decides or the approval window closes."),
        Phase(
            "asking",
            "Waiting for the customer",
            "Asked the customer for what only they can give; judged again with their answer, closed at the deadline.",
        ),
        Phase("paying", "Paying", "Approved; the payment provider is being asked to refund."),
        Phase("settling", "Settling", "The provider accepted the refund and has not confirmed it yet."),
        Phase("paid", "Paid", "The customer was refunded."),
        Phase("refused", "Refused", "Nothing was paid: policy or an approver refused it."),
        Phase("expired", "Expired", "Nobody decided before the approval window closed, so nothing was paid."),
        Phase("failed", "Failed", "The payment did not go through."),
        Phase("cancelled", "Stopped", "An admin stopped it; nothing more happens until someone resumes it."),
    )
}
ENDED = ("paid", "refused", "expired", "failed")
ACTION_LABELS = {"cancel": "Stop this refund", "resume": "Resume this refund", "fork": "Retry the payment"}
"""The admin actions (routes ``cancel``, ``resume``, ``fork``) as the console names them."""


def phase_of(row_status: str | None, decision: str | None) -> Phase:
    """``row_status``: the refund's ``refunds.status``; ``decision``: its approval decision, if one was recorded."""
    status = row_status or "received"
    if status == "awaiting_approval":
        key = {"approve": "paying", "reject": "refused", "expired": "expired"}.get(decision or "", "parked")
    elif status == "rejected":
        key = "expired" if decision == "expired" else "refused"
    elif status in ("received", "deciding"):
        key = "deciding"
    elif status == "awaiting_customer":
        key = "asking"
    else:
        key = {"completed": "paid"}.get(status, status)
    return PHASES.get(key, Phase(key, key.replace("_", " ").capitalize(), ""))


def where_phase(
    key: str, status: sa.ColumnElement[str], decision: sa.ColumnElement[str | None]
) -> sa.ColumnElement[bool]:
    """The SQL condition on a refund's row status and its decision that ``phase_of`` would call ``key``."""
    waiting = status == "awaiting_approval"
    match key:
        case "deciding":
            return status.in_(("received", "deciding"))
        case "asking":
            return status == "awaiting_customer"
        case "parked":
            return sa.and_(waiting, decision.is_(None))
        case "paying":
            return sa.or_(status == "paying", sa.and_(waiting, decision == "approve"))
        case "paid":
            return status == "completed"
        case "refused":
            rejected = sa.and_(status == "rejected", sa.or_(decision.is_(None), decision != "expired"))
            return sa.or_(rejected, sa.and_(waiting, decision == "reject"))
        case "expired":
            return sa.and_(status.in_(("rejected", "awaiting_approval")), decision == "expired")
        case _:
            return status == key
