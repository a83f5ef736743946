"""What the console pages show, read from the application database and DBOS's system database."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from dbos import DBOSClient, WorkflowStatus

from agent.console.phases import PHASES, phase_of, where_phase
from agent.conversation import Conversation, conversation, request_messages
from agent.status import amounts_refunded, refund_status, speaking, step_timeline, workflows_of
from steps import audit, outbox_view
from steps.payments import idempotency_key
from steps.records import AuditEntry, format_moment, format_money, from_minor
from steps.store import app_db, approval_decisions, approval_requests, customers, orders, refunds, utc

if TYPE_CHECKING:
    from agent.settings import ModelPrice

PAGE_SIZE = 20
ACTIVE = ("ENQUEUED", "PENDING")  # running or about to; a DELAYED timer is waiting, not running
_WITH_CUSTOMER = refunds.outerjoin(orders, orders.c.order_id == refunds.c.order_id).outerjoin(
    customers, customers.c.customer_id == orders.c.customer_id
)


def span(delta: timedelta) -> str:
    """A short human duration: 45s, 12m, 3h 5m, 2d 4h."""
    seconds = int(abs(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{secs}s"


def pending_approvals(client: DBOSClient, now: datetime) -> list[dict[str, Any]]:
    """Refunds waiting for a person, oldest first, with the time left before escalation and expiry."""
    query = (
        sa.select(
            refunds.c.refund_id,
            refunds.c.order_id,
            customers.c.name.label("customer"),
            approval_requests.c.amount_minor,
            approval_requests.c.currency,
            approval_requests.c.reason,
            approval_requests.c.requested_at,
            approval_requests.c.escalate_at,
            approval_requests.c.expires_at,
            approval_requests.c.escalated_at,
        )
        .select_from(
            _WITH_CUSTOMER.join(approval_requests, approval_requests.c.refund_id == refunds.c.refund_id).outerjoin(
                approval_decisions, approval_decisions.c.refund_id == refunds.c.refund_id
            )
        )
        .where(approval_decisions.c.refund_id.is_(None))
        .order_by(approval_requests.c.requested_at, refunds.c.refund_id)
        .limit(100)
    )
    with app_db().engine.connect() as conn:
        rows = list(conn.execute(query))
    messages = request_messages(client, [r.refund_id for r in rows])
    pending = []
    for row in rows:
        amount = from_minor(row.amount_minor, row.currency)
        escalate, expires = utc(row.escalate_at), utc(row.expires_at)
        pending.append(
            {
                "refund_id": row.refund_id,
                "order_id": row.order_id,
                "customer": row.customer or "?",
                "money": format_money(amount, row.currency),
                "amount": str(amount),
                "currency": row.currency,
                "reason": row.reason,
                "message": messages.get(row.refund_id, ""),
                "age": span(now - utc(row.requested_at)),
                "escalates_in": "escalated" if row.escalated_at or escalate <= now else span(escalate - now),
                "expires_in": span(expires - now) if expires > now else "expired",
            }
        )
    return pending


@dataclass(frozen=True)
class RefundFilter:
    phase: str | None = None
    order: str | None = None
    since: date | None = None
    until: date | None = None
    page: int = 1


def list_refunds(flt: RefundFilter) -> tuple[list[dict[str, Any]], bool]:
    """One page of refunds, newest first, and whether another page follows."""
    query = sa.select(refunds, customers.c.name.label("customer"), approval_decisions.c.decision).select_from(
        _WITH_CUSTOMER.outerjoin(approval_decisions, approval_decisions.c.refund_id == refunds.c.refund_id)
    )
    if flt.phase in PHASES:
        query = query.where(where_phase(flt.phase, refunds.c.status, approval_decisions.c.decision))
    if flt.order:
        query = query.where(refunds.c.order_id == flt.order)
    if flt.since:
        query = query.where(refunds.c.created_at >= datetime.combine(flt.since, datetime.min.time(), UTC))
    if flt.until:
        end = datetime.combine(flt.until, datetime.min.time(), UTC) + timedelta(days=1)
        query = query.where(refunds.c.created_at < end)
    query = query.order_by(refunds.c.created_at.desc(), refunds.c.refund_id.desc())
    query = query.offset((flt.page - 1) * PAGE_SIZE).limit(PAGE_SIZE + 1)
    with app_db().engine.connect() as conn:
        rows = list(conn.execute(query))
        paid = amounts_refunded(conn, rows[:PAGE_SIZE])
    items = []
    for row in rows[:PAGE_SIZE]:
        asked = row.requested_amount_minor
        items.append(
            {
                "refund_id": row.refund_id,
                "phase": phase_of(row.status, row.decision),
                "order_id": row.order_id,
                "customer": row.customer or "?",
                "asked": format_money(from_minor(asked, row.currency), row.currency) if asked is not None else None,
                "paid": format_money(paid[row.refund_id], row.currency) if row.refund_id in paid else None,
                "created_at": utc(row.created_at).strftime("%Y-%m-%d %H:%M"),
            }
        )
    return items, len(rows) > PAGE_SIZE


def paid_line(entries: list[AuditEntry]) -> str | None:
    """What was paid, when, and under which provider refund, from the refund's last ``refund_paid`` entry."""
    paid = next((e for e in reversed(entries) if e.event == "refund_paid"), None)
    if paid is None:
        return None
    money = format_money(Decimal(str(paid.payload["amount"])), str(paid.payload["currency"]))
    provider_refund = paid.payload["provider_refund_id"]
    return f"Paid {money} on {format_moment(paid.created_at)} — provider refund {provider_refund}"


#: The phases in which a refund waits on a timer (a deadline, a reminder, the provider's next re-read).
WAITING = ("awaiting_approval", "settling")


def _execution(client: DBOSClient, wf: WorkflowStatus, *, waiting: bool = True) -> dict[str, Any]:
    """One run as the page shows it. ``waiting``: whether the refund still waits; a decided refund's timer, made due
    to run and end, shows no due time."""
    steps = step_timeline(client, [wf])
    starts = [datetime.fromisoformat(s["start"]) for s in steps if s["start"]]
    ends = [datetime.fromisoformat(s["end"]) for s in steps if s["end"]]
    origin = min(starts) if starts else None
    total = max((max(ends) - origin).total_seconds() * 1000, 1.0) if origin and ends else 1.0
    for step in steps:
        if origin and step["start"]:
            offset = (datetime.fromisoformat(step["start"]) - origin).total_seconds() * 1000
            step["left"] = round(100 * offset / total, 2)
            step["width"] = max(round(100 * (step["duration_ms"] or 0) / total, 2), 0.5)
        else:
            step["left"], step["width"] = 0.0, 0.5
    return {
        "workflow_id": wf.workflow_id,
        "status": wf.status,
        "attempts": wf.recovery_attempts or 1,
        "executor_id": wf.executor_id,
        "forked_from": wf.forked_from,
        "created_at": datetime.fromtimestamp(wf.created_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        if wf.created_at
        else None,
        "active": wf.status in ACTIVE,
        "due_at": datetime.fromtimestamp(wf.delay_until_epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        if waiting and wf.status == "DELAYED" and wf.delay_until_epoch_ms
        else None,
        "total_ms": round(total) if ends else None,
        "steps": steps,
    }


def refund_detail(
    client: DBOSClient, refund_id: str, *, prices: Mapping[str, ModelPrice] | None = None
) -> dict[str, Any] | None:
    """Everything the detail page shows; None when there is no such refund."""
    status = refund_status(client, refund_id, prices=prices)
    if status is None:
        return None
    with app_db().engine.connect() as conn:
        row = conn.execute(
            sa.select(refunds, customers.c.name.label("customer"))
            .select_from(_WITH_CUSTOMER)
            .where(refunds.c.refund_id == refund_id)
        ).first()
        entries = audit.entries(conn, refund_id)
        chain = audit.verify(conn)
        messages = outbox_view.deliveries(conn, refund_id)
        talk = conversation(conn, client, refund_id)
    runs = workflows_of(client, refund_id)
    target = speaking(runs, refund_id)
    verdict = next((e.payload for e in reversed(entries) if e.event == "policy_verdict"), None)
    order_id = status["order_id"]
    decision = status["approval"]["decision"] if status["approval"] else None
    phase = phase_of(row.status if row else None, decision)
    return {
        **status,
        "phase": phase,
        "paid": paid_line(entries) if phase.key == "paid" else None,
        "row_status": row.status if row else None,
        "customer": row.customer if row else None,
        "created_at": utc(row.created_at).strftime("%Y-%m-%d %H:%M:%S") if row else None,
        "message": request_messages(client, [refund_id]).get(refund_id, ""),
        "verdict_detail": verdict,
        "expected_key": idempotency_key(refund_id, order_id) if order_id else None,
        "executions": [_execution(client, wf, waiting=status["status"] in WAITING) for wf in runs],
        "target": _execution(client, target, waiting=status["status"] in WAITING) if target else None,
        "audit": [
            {
                "seq": e.seq,
                "event": e.event,
                "at": e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                "payload": e.payload,
                "hash": e.hash[:12],
                "intact": chain.ok or (chain.first_broken_seq is not None and e.seq < chain.first_broken_seq),
            }
            for e in entries
        ],
        "chain": chain,
        "deliveries": [_delivery(m) for m in messages],
        "conversation": _conversation(talk),
    }


#: How the console names what a message to the customer was about.
ABOUT = {
    "outcome": "the outcome",
    "waiting": "waiting for a person",
    "request": "their request",
    "comment": "a reply",
    "question": "the question",
    "reminder": "a reminder of the question",
    "answer": "their answer",
}


#: What a refund asks its customer for, as the console names it.
ASKED_FOR = {
    "delivery": "to confirm the parcel shown delivered never came",
    "photo": "a photo of the item",
    "return_tracking": "the return's tracking number",
}


def _moment(at: datetime | None) -> str | None:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else None


def _conversation(talk: Conversation | None) -> dict[str, Any]:
    turns = talk.turns if talk else []
    q = talk.question if talk else None
    return {
        "ticket_id": talk.ticket_id if talk else None,
        "question": q
        and {
            "kind": q.question,
            "asked_for": ASKED_FOR.get(q.question, q.question),
            "state": q.state.replace("_", " "),
            "open": q.state == "open",
            "asked_at": _moment(q.asked_at),
            "remind_at": _moment(q.remind_at),
            "reminded_at": _moment(q.reminded_at),
            "deadline": _moment(q.expires_at),
            "answered_at": _moment(q.answered_at),
        },
        "turns": [
            {
                "at": t.at.strftime("%Y-%m-%d %H:%M:%S"),
                "speaker": t.speaker,
                "channel": t.channel,
                "about": ABOUT.get(t.about, t.about.replace("_", " ")),
                "text": t.text,
                "delivery": t.delivery,
                "details": list(t.details),
            }
            for t in turns
        ],
    }


def _delivery(m: outbox_view.Delivery) -> dict[str, Any]:
    return {
        "refund_id": m.refund_id,
        "to": {"email": "customer", "approvers": "approver", "operators": "operators"}.get(m.channel, m.channel),
        "recipient": m.recipient,
        "state": m.state,
        "attempts": m.attempts,
        "last_error": m.last_error,
        "queued_at": m.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        "sent_at": m.sent_at.strftime("%Y-%m-%d %H:%M:%S") if m.sent_at else None,
    }


def failed_deliveries() -> tuple[int, list[dict[str, Any]]]:
    """How many outbox messages failed for good, and the latest of them (never their bodies)."""
    with app_db().engine.connect() as conn:
        count, latest = outbox_view.failed(conn)
    return count, [_delivery(m) for m in latest]
