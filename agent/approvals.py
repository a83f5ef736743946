"""Human approval: the workflow waits on a recv topic; decisions are recorded first-writer-wins."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from dbos import DBOS, DBOSClient

from agent import tokens
from agent.domain import PHASE_EVENT, ApprovalRecord, Phase, Verdict
from agent.offloop import call
from agent.parking import queue_slot_released
from steps.faults import crash_point
from steps.notify import notify_approvers_step, slack_approvers_step, slack_enabled
from steps.records import format_money
from steps.refunds import open_approval_step, record_decision, recorded_decision, settle_approval_step
from steps.store import app_db

# Durable names: in-flight workflows wait on these; never rename them.
APPROVAL_TOPIC = "approval_decision"
APPROVAL_EVENT = "approval_request"

Decision = Literal["approve", "reject"]


class ApprovalError(Exception):
    """A decision that cannot be taken; ``code`` says why (the HTTP layer maps it to a status)."""

    def __init__(self, code: str, message: str, recorded: ApprovalRecord | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.recorded = recorded


@dataclass(frozen=True)
class ApprovalSettings:
    escalate_after: float
    timeout: float
    signing_secret: bytes
    public_url: str


async def await_decision(
    refund_id: str, verdict: Verdict, *, reason: str, config: ApprovalSettings, publish_phase: bool = False
) -> ApprovalRecord:
    """Workflow side: publish the request, notify, wait (durably), escalate once, then expire.

    ``publish_phase`` keeps the phase event that refunds started before the lean-checkpoints patch
    published here; later refunds show their phase through the refund's row (``open_approval``).
    """
    escalate_after, timeout = config.escalate_after, config.timeout
    window = await call(open_approval_step, refund_id, escalate_after=escalate_after, timeout=timeout)
    claims = tokens.ApprovalClaims(
        refund_id=refund_id, amount=verdict.amount, currency=verdict.currency, expires_at=window.expires_at
    )
    token = tokens.sign(claims, config.signing_secret)  # pure: the same token on every replay
    link = f"{config.public_url.rstrip('/')}/approve/{token}"
    await DBOS.set_event_async(
        APPROVAL_EVENT,
        {
            "refund_id": refund_id,
            "amount": str(verdict.amount),
            "currency": verdict.currency,
            "reason": reason,
            "requested_at": window.requested_at.isoformat(),
            "escalate_at": window.escalate_at.isoformat(),
            "expires_at": window.expires_at.isoformat(),
        },
    )
    if publish_phase:
        await DBOS.set_event_async(PHASE_EVENT, Phase.AWAITING_APPROVAL.value)  # after the request it refers to
    money = format_money(verdict.amount, verdict.currency)
    text = f"Refund {refund_id} of {money} needs approval: {reason}"
    await call(notify_approvers_step, refund_id, kind="request", text=f"{text}\nDecide: {link}")
    if slack_enabled():
        await call(slack_approvers_step, refund_id, text=text, link=link, token=token)
    with queue_slot_released():  # waiting for a person must not keep other refunds from starting
        message = await DBOS.recv_async(APPROVAL_TOPIC, timeout_seconds=escalate_after)
        if message is None:
            escalation = f"Escalation: refund {refund_id} of {money} is still waiting: {link}"
            await call(notify_approvers_step, refund_id, kind="escalation", text=escalation)
            message = await DBOS.recv_async(APPROVAL_TOPIC, timeout_seconds=max(timeout - escalate_after, 0.0))
    if message is not None:
        crash_point("after_approval_received")
    # The recorded row is the decision; the message only wakes us. Expiry is recorded unless a person won.
    return await call(settle_approval_step, refund_id, amount=verdict.amount, currency=verdict.currency)


@dataclass(frozen=True)
class DecisionResult:
    record: ApprovalRecord
    first: bool
    """True when this call recorded the decision; False when an earlier one stands."""


def pending_request(client: DBOSClient, refund_id: str) -> dict[str, Any] | None:
    event = client.get_event(refund_id, APPROVAL_EVENT, timeout_seconds=0)
    return event if isinstance(event, dict) else None


def decide(
    client: DBOSClient,
    *,
    refund_id: str,
    decision: Decision,
    approver: str,
    amount: Decimal,
    currency: str,
    now: datetime | None = None,
) -> DecisionResult:
    """Record a person's decision, bound to the amount and currency they saw, and wake the workflow."""
    now = now or datetime.now(UTC)
    approver = approver.strip()
    if not approver or "\x00" in approver or len(approver) > 200:
        raise ApprovalError("invalid", "an approver name (1-200 characters, no NUL) is required")
    with app_db().engine.connect() as conn:
        existing = recorded_decision(conn, refund_id)
    if existing is not None and existing.decision == "expired":
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed", existing)
    if existing is not None:
        return _resend(client, existing, first=False)
    request = pending_request(client, refund_id)
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    if Decimal(request["amount"]) != amount or request["currency"] != currency:
        raise ApprovalError(
            "mismatch",
            f"the decision is for {amount} {currency} but the refund awaits {request['amount']} {request['currency']}",
        )
    if now >= datetime.fromisoformat(request["expires_at"]):
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed")
    record, first = record_decision(
        ApprovalRecord(
            refund_id=refund_id,
            decision=decision,
            approver=approver,
            amount=amount,
            currency=currency,
            decided_at=now,
        )
    )
    return _resend(client, record, first=first)


def decide_pending(client: DBOSClient, *, refund_id: str, decision: Decision, approver: str) -> DecisionResult:
    """Decide for the amount and currency the refund is waiting on, as an approver looking at it sees them."""
    request = pending_request(client, refund_id)
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    return decide(
        client, refund_id=refund_id, decision=decision, approver=approver,
        amount=Decimal(request["amount"]), currency=request["currency"],
    )  # fmt: skip


def _resend(client: DBOSClient, record: ApprovalRecord, *, first: bool) -> DecisionResult:
    # Sent on every call: the idempotency key drops repeats, and a crash between record and send heals.
    if record.decision != "expired":
        client.send(
            record.refund_id,
            {"decision": record.decision},
            APPROVAL_TOPIC,
            idempotency_key=f"approval:{record.refund_id}",
        )
    return DecisionResult(record=record, first=first)
