"""The approval book: a parked refund's request for a person's decision, the decision (first writer wins), the
reminder and the deadline; every write also appends to the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from steps import audit
from steps.notify import queue_approvers_messages
from steps.records import ApprovalRecord, ApprovalRequest, ModelUsage, from_minor, to_minor
from steps.refunds import record_outcome, record_verdict, touch
from steps.store import (
    approval_decisions,
    approval_requests,
    insert_if_absent,
    read_step,
    refunds,
    session,
    transaction,
    utc,
)


@transaction("refunds.open_approval")
def open_approval_step(
    refund_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None = None,
    amount: Decimal,
    currency: str,
    reason: str,
    escalate_after: float,
    timeout: float,
    evidence: dict[str, Any] | None = None,
) -> ApprovalRequest:
    """Record the verdict and the approval request it needs, together; the refund is parked from here on.

    A fork that runs this step again keeps the first request (and its deadlines)."""
    now = datetime.now(UTC)
    record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    values = {
        "refund_id": refund_id,
        "amount_minor": to_minor(amount, currency),
        "currency": currency,
        "reason": reason,
        "requested_at": now,
        "escalate_at": now + timedelta(seconds=escalate_after),
        "expires_at": now + timedelta(seconds=timeout),
    }
    insert_if_absent(session(), approval_requests, values)
    request = approval_request(session(), refund_id)
    assert request is not None
    touch(refund_id, now, status="awaiting_approval")
    window = {
        "requested_at": request.requested_at.isoformat(),
        "escalate_at": request.escalate_at.isoformat(),
        "expires_at": request.expires_at.isoformat(),
    }
    audit.append(session(), refund_id=refund_id, event="approval_requested", payload=window, now=now)
    return request


def approval_request(conn: sa.Connection | Any, refund_id: str) -> ApprovalRequest | None:
    """The approval a refund waits on (or waited on), with who requested the refund."""
    row = conn.execute(
        sa.select(approval_requests, refunds.c.requested_by, refunds.c.requester_operator)
        .outerjoin(refunds, refunds.c.refund_id == approval_requests.c.refund_id)
        .where(approval_requests.c.refund_id == refund_id)
    ).first()
    if row is None:
        return None
    return ApprovalRequest(
        refund_id=row.refund_id,
        amount=from_minor(row.amount_minor, row.currency),
        currency=row.currency,
        reason=row.reason,
        requested_at=utc(row.requested_at),
        escalate_at=utc(row.escalate_at),
        expires_at=utc(row.expires_at),
        escalated_at=utc(row.escalated_at) if row.escalated_at else None,
        requested_by=row.requested_by,
        requester_operator=row.requester_operator,
    )


def _approval_from_row(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        refund_id=row.refund_id,
        decision=row.decision,
        approver=row.approver,
        amount=from_minor(row.amount_minor, row.currency),
        currency=row.currency,
        decided_at=utc(row.decided_at),
        note=row.note,
        via=row.via,
    )


def recorded_decision(conn: sa.Connection | Any, refund_id: str) -> ApprovalRecord | None:
    row = conn.execute(sa.select(approval_decisions).where(approval_decisions.c.refund_id == refund_id)).first()
    return _approval_from_row(row) if row else None


def _claim_decision(conn: Any, record: ApprovalRecord) -> tuple[ApprovalRecord, bool]:
    """Insert the decision unless one exists; return the recorded one and whether it is ours."""
    values = {
        "refund_id": record.refund_id,
        "decision": record.decision,
        "approver": record.approver,
        "amount_minor": to_minor(record.amount, record.currency),
        "currency": record.currency,
        "decided_at": record.decided_at,
        "note": record.note,
        "via": record.via,
    }
    if not insert_if_absent(conn, approval_decisions, values):
        existing = recorded_decision(conn, record.refund_id)
        assert existing is not None
        return existing, False
    asked = conn.execute(
        sa.select(approval_requests.c.amount_minor, approval_requests.c.currency).where(
            approval_requests.c.refund_id == record.refund_id
        )
    ).first()
    payload = record.model_dump()
    if asked is not None:  # an approver may approve less than asked: the entry names both
        payload["asked_amount"] = from_minor(asked.amount_minor, asked.currency)
    audit.append(conn, refund_id=record.refund_id, event="approval_decided", payload=payload, now=record.decided_at)
    return record, True


@transaction("refunds.record_decision")
def record_decision_step(record: ApprovalRecord) -> ApprovalRecord:
    """A person's decision, first writer wins: concurrent writers serialize on the key and all see one."""
    standing, _ = _claim_decision(session(), record)
    return standing


@read_step("refunds.standing_decision")
def standing_decision_step(conn: sa.Connection, refund_id: str) -> ApprovalRecord | None:
    """The recorded decision, for a continuation whose decision message did not come."""
    return recorded_decision(conn, refund_id)


@transaction("refunds.expire_approval")
def expire_approval_step(
    refund_id: str, *, amount: Decimal, currency: str, detail: str, reply: str | None
) -> ApprovalRecord:
    """At the deadline: the decision that stands. With none, the expiry is recorded and the refund ends
    rejected, its customer told, in this one transaction; a person's decision that won the race stands."""
    now = datetime.now(UTC)
    expired = ApprovalRecord(
        refund_id=refund_id,
        decision="expired",
        approver="system",
        amount=amount,
        currency=currency,
        decided_at=now,
        note="no decision before the approval deadline",
        via="deadline",
    )
    standing, ours = _claim_decision(session(), expired)
    if ours:
        record_outcome(refund_id, now, status="rejected", detail=detail, reply=reply)
    return standing


@transaction("refunds.escalate_approval")
def escalate_approval_step(refund_id: str, *, messages: dict[str, str]) -> bool:
    """Remind approvers once (operator name -> text with their link), unless the refund was decided meanwhile;
    True when the reminder was queued."""
    if recorded_decision(session(), refund_id) is not None:
        return False
    now = datetime.now(UTC)
    session().execute(
        approval_requests.update().where(approval_requests.c.refund_id == refund_id).values(escalated_at=now)
    )
    queue_approvers_messages(refund_id, kind="escalation", messages=messages)
    audit.append(session(), refund_id=refund_id, event="approval_escalated", payload={}, now=now)
    return True
