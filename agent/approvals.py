"""Human approval: a parked refund is rows; a decision is recorded first-writer-wins and sent to its continuation.

A refund that needs a person ends its workflow after ``open_approval`` with two DELAYED workflows
behind it (the deadline and the escalation reminder). A decision runs the refund's decision workflow
(``{refund_id}/decision``), which records it and hands it to the continuation (``{refund_id}/settle``)
by ``send``; the continuation ``recv``s it, re-checks and pays. Every id is derived from the refund's,
so each of these runs at most once per refund, and a repeated or concurrent decision meets the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from dbos import DBOSClient, EnqueueOptions, WorkflowHandle

from agent import tokens
from agent.domain import ApprovalRecord
from steps.records import ApprovalRequest, format_money
from steps.refunds import approval_request, recorded_decision
from steps.store import app_db

# Durable names: workflows, topics and queues recorded in the system database; never rename them.
APPROVAL_TOPIC = "approval_decision"
APPROVAL_QUEUE = "approvals"
DECISION_WORKFLOW = "approval_decision_workflow"
DEADLINE_WORKFLOW = "approval_deadline_workflow"
ESCALATION_WORKFLOW = "approval_escalation_workflow"
SETTLE_WORKFLOW = "settle_refund_workflow"

Decision = Literal["approve", "reject"]
#: Runs a refund's decision workflow with this record (unless one ran already) and returns the standing one.
Decider = Callable[[ApprovalRecord], ApprovalRecord]


def decision_id(refund_id: str) -> str:
    return f"{refund_id}/decision"


def settle_id(refund_id: str) -> str:
    return f"{refund_id}/settle"


def deadline_id(refund_id: str) -> str:
    return f"{refund_id}/deadline"


def escalation_id(refund_id: str) -> str:
    return f"{refund_id}/escalate"


def family(refund_id: str) -> list[str]:
    """Every workflow id a refund can have ('/' never appears in a refund id, so none is another refund's)."""
    return [refund_id, decision_id(refund_id), settle_id(refund_id), deadline_id(refund_id), escalation_id(refund_id)]


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


def link(config: ApprovalSettings, claims: tokens.ApprovalClaims) -> tuple[str, str]:
    """The signed token for an approval request and the page it opens (pure: the same on every replay)."""
    token = tokens.sign(claims, config.signing_secret)
    return token, f"{config.public_url.rstrip('/')}/approve/{token}"


def claims_of(request: ApprovalRequest) -> tokens.ApprovalClaims:
    return tokens.ApprovalClaims(
        refund_id=request.refund_id, amount=request.amount, currency=request.currency, expires_at=request.expires_at
    )


def request_text(request: ApprovalRequest) -> str:
    money = format_money(request.amount, request.currency)
    return f"Refund {request.refund_id} of {money} needs approval: {request.reason}"


def escalation_text(claims: tokens.ApprovalClaims, url: str) -> str:
    money = format_money(claims.amount, claims.currency)
    return f"Escalation: refund {claims.refund_id} of {money} is still waiting: {url}"


@dataclass(frozen=True)
class DecisionResult:
    record: ApprovalRecord
    first: bool
    """True when this call's decision is the one recorded; False when an earlier one stands."""


def request_view(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "refund_id": request.refund_id,
        "amount": str(request.amount),
        "currency": request.currency,
        "reason": request.reason,
        "requested_at": request.requested_at.isoformat(),
        "escalate_at": request.escalate_at.isoformat(),
        "expires_at": request.expires_at.isoformat(),
        "escalated_at": request.escalated_at.isoformat() if request.escalated_at else None,
    }


def pending_request(refund_id: str) -> dict[str, Any] | None:
    """The approval request a refund waits on, while no decision (or expiry) answers it."""
    with app_db().engine.connect() as conn:
        request = approval_request(conn, refund_id)
        if request is None or recorded_decision(conn, refund_id) is not None:
            return None
    return request_view(request)


def decide(
    run: Decider,
    *,
    refund_id: str,
    decision: Decision,
    approver: str,
    amount: Decimal,
    currency: str,
    now: datetime | None = None,
) -> DecisionResult:
    """Take a person's decision, bound to the amount and currency they saw; the first one stands."""
    now = now or datetime.now(UTC)
    approver = approver.strip()
    if not approver or "\x00" in approver or len(approver) > 200:
        raise ApprovalError("invalid", "an approver name (1-200 characters, no NUL) is required")
    with app_db().engine.connect() as conn:
        existing = recorded_decision(conn, refund_id)
        request = approval_request(conn, refund_id)
    if existing is not None and existing.decision == "expired":
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed", existing)
    if existing is not None:  # recorded by the refund's decision workflow, which also hands it over
        return DecisionResult(record=existing, first=False)
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    if (request.amount, request.currency) != (amount, currency):
        raise ApprovalError(
            "mismatch",
            f"the decision is for {amount} {currency} but the refund awaits {request.amount} {request.currency}",
        )
    if now >= request.expires_at:
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed")
    mine = ApprovalRecord(
        refund_id=refund_id, decision=decision, approver=approver, amount=amount, currency=currency, decided_at=now
    )
    standing = run(mine)
    if standing.decision == "expired":  # the deadline won the race
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed", standing)
    return DecisionResult(record=standing, first=standing == mine)


def decide_pending(run: Decider, *, refund_id: str, decision: Decision, approver: str) -> DecisionResult:
    """Decide for the amount and currency the refund is waiting on, as an approver looking at it sees them."""
    with app_db().engine.connect() as conn:
        existing = recorded_decision(conn, refund_id)
        request = approval_request(conn, refund_id)
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    if existing is not None and existing.decision != "expired":
        return DecisionResult(record=existing, first=False)
    return decide(
        run, refund_id=refund_id, decision=decision, approver=approver, amount=request.amount, currency=request.currency
    )


def decider_via_queue(client: DBOSClient, *, timeout: float = 60.0) -> Decider:
    """For processes that do not run DBOS (the CLI): the decision workflow goes on the approvals queue,
    version-less (any worker of the latest release takes it), and this waits for what it recorded."""

    def run(record: ApprovalRecord) -> ApprovalRecord:
        options: EnqueueOptions = {
            "queue_name": APPROVAL_QUEUE,
            "workflow_name": DECISION_WORKFLOW,
            "workflow_id": decision_id(record.refund_id),
        }
        handle: WorkflowHandle[dict[str, Any]] = client.enqueue(
            options, record.refund_id, record.model_dump(mode="json")
        )
        deadline = time.monotonic() + timeout
        while (status := handle.get_status().status) not in ("SUCCESS", "ERROR", "CANCELLED"):
            if time.monotonic() > deadline:
                raise ApprovalError("queued", f"the decision on refund {record.refund_id} waits for a worker")
            time.sleep(0.05)
        if status != "SUCCESS":
            raise ApprovalError("failed", f"the decision workflow of refund {record.refund_id} ended {status}")
        return ApprovalRecord.model_validate(handle.get_result())

    return run
