"""Human approval: a parked refund is rows; a decision is recorded first-writer-wins and sent to its continuation.

A refund that needs a person ends its workflow after ``open_approval`` with two DELAYED workflows
behind it (the deadline and the escalation reminder). A decision runs the refund's decision workflow
(``{refund_id}/decision``), which records it and hands it to the continuation (``{refund_id}/settle``)
by ``send``; the continuation ``recv``s it, re-checks and pays. Every id is derived from the refund's,
so each of these runs at most once per refund, and a repeated or concurrent decision meets the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from dbos import DBOSClient, EnqueueOptions, WorkflowHandle

from agent import tokens
from agent.claims import claim_text
from agent.decision_checks import ApprovalError as ApprovalError
from agent.decision_checks import Checked as Checked
from agent.decision_checks import Decision as Decision
from agent.decision_checks import check as check
from agent.decision_checks import parse_amount as parse_amount
from agent.domain import ApprovalRecord
from agent.identity import Principal
from steps.approval_book import approval_request, recorded_decision
from steps.records import ApprovalRequest, format_money
from steps.store import app_db

# Durable names: workflows, topics and queues recorded in the system database; never rename them.
APPROVAL_TOPIC = "approval_decision"
APPROVAL_QUEUE = "approvals"
DECISION_WORKFLOW = "approval_decision_workflow"
DEADLINE_WORKFLOW = "approval_deadline_workflow"
ESCALATION_WORKFLOW = "approval_escalation_workflow"
SETTLE_WORKFLOW = "settle_refund_workflow"

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


#: The approver a Slack button's token is bound to: the clicking user, checked against the allow-list.
SLACK_APPROVER = "slack"


@dataclass(frozen=True)
class ApprovalSettings:
    escalate_after: float
    timeout: float
    signing_secret: bytes
    public_url: str
    approvers: tuple[str, ...] = ()
    """Operators who may decide (role approver or admin): each gets a link of their own."""


def link(config: ApprovalSettings, claims: tokens.ApprovalClaims) -> tuple[str, str]:
    """The signed token for an approval request and the page it opens (pure: the same on every replay)."""
    token = tokens.sign(claims, config.signing_secret)
    return token, f"{config.public_url.rstrip('/')}/approve/{token}"


def claims_of(request: ApprovalRequest, approver: str) -> tokens.ApprovalClaims:
    return tokens.ApprovalClaims(
        refund_id=request.refund_id,
        amount=request.amount,
        currency=request.currency,
        expires_at=request.expires_at,
        approver=approver,
    )


def approver_links(config: ApprovalSettings, claims: tokens.ApprovalClaims) -> dict[str, str]:
    """Each approver's own link (operator name -> URL), bound to them: whoever opens it decides as them."""
    return {
        name: link(config, replace(claims, approver=str(Principal("operator", name))))[1] for name in config.approvers
    }


def request_text(request: ApprovalRequest, *, category: str | None = None, evidence: list[str] | None = None) -> str:
    """What approvers are sent (links and Slack): the request and its reason, then the claim's category and its
    evidence (``agent.claims`` lines), so they decide on what was looked up. Plain text: Slack escapes it."""
    money = format_money(request.amount, request.currency)
    return f"Refund {request.refund_id} of {money} needs approval: {request.reason}" + claim_text(category, evidence)


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
    approver: Principal,
    via: str,
    amount: Decimal | None,
    currency: str,
    asked: Decimal | None = None,
    authority: Mapping[str, Mapping[str, Decimal]] | None = None,
    deciders: Collection[str] | None = None,
    now: datetime | None = None,
) -> DecisionResult:
    """Take a person's decision for ``amount`` (at most what the refund awaits; None: what it awaits); the first
    one stands.

    ``asked`` is the amount the approver was shown as awaited, when the channel showed one (a page, a link):
    a decision taken on a stale view is refused. ``approver`` is who the channel (``via``) established: a
    signed-in operator, the approver a link was sent to, an allow-listed Slack user's operator, an API client,
    the OS user. The refund's requester may never decide it, whichever principal the same person uses;
    ``authority`` caps the amount a principal (and the operator it acts for) may approve (settings
    ``APPROVAL_LIMITS``); ``deciders``: the operators who may decide now, for a principal acting for one."""
    now = now or datetime.now(UTC)
    checked = check(
        refund_id=refund_id,
        decision=decision,
        approver=approver,
        amount=amount,
        currency=currency,
        asked=asked,
        authority=authority,
        deciders=deciders,
        now=now,
    )
    if checked.standing is not None:
        return DecisionResult(record=checked.standing, first=False)
    mine = ApprovalRecord(
        refund_id=refund_id,
        decision=decision,
        approver=str(approver),
        amount=checked.amount,
        currency=currency,
        decided_at=now,
        via=via,
    )
    standing = run(mine)
    if standing.decision == "expired":  # the deadline won the race
        raise ApprovalError("expired", f"the approval window for refund {refund_id} has closed", standing)
    return DecisionResult(record=standing, first=standing == mine)


def decide_pending(
    run: Decider,
    *,
    refund_id: str,
    decision: Decision,
    approver: Principal,
    via: str,
    authority: Mapping[str, Mapping[str, Decimal]] | None = None,
    amount: Decimal | None = None,
    deciders: Collection[str] | None = None,
) -> DecisionResult:
    """Decide in the currency the refund is waiting on, for ``amount`` (an approval of less) or the amount it
    awaits."""
    with app_db().engine.connect() as conn:
        request = approval_request(conn, refund_id)
    if request is None:
        raise ApprovalError("nothing_pending", f"refund {refund_id} is not waiting for an approval")
    return decide(
        run,
        refund_id=refund_id,
        decision=decision,
        approver=approver,
        via=via,
        amount=amount,
        currency=request.currency,
        authority=authority,
        deciders=deciders,
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
