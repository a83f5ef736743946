"""The workflows around a parked refund: its timers, a person's decision, and the hand-over to its continuation.

None of them waits: the deadline and the escalation are DELAYED rows until they are due, and the
decision workflow records, enqueues the continuation and sends it the decision in three short steps.
All are enqueued without an application version, so they run on whatever release is deployed when
they become due (see README, "Upgrades").
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from dbos import DBOS, EnqueueOptions, SetWorkflowID

from agent import replies, tokens
from agent.approvals import (
    APPROVAL_QUEUE,
    APPROVAL_TOPIC,
    DEADLINE_WORKFLOW,
    DECISION_WORKFLOW,
    ESCALATION_WORKFLOW,
    SETTLE_WORKFLOW,
    ApprovalSettings,
    approver_links,
    deadline_id,
    decision_id,
    escalation_id,
    escalation_text,
    settle_id,
)
from agent.context import current
from agent.domain import ApprovalRecord
from steps.approval_book import escalate_approval_step, expire_approval_step, record_decision_step
from steps.faults import crash_point
from steps.records import ApprovalRequest

EXPIRED_DETAIL = "approval expired: no decision before the deadline"
#: Durable step name. Each workflow that decides a refund runs it as its last step, so workflows a release
#: without it recorded replay unchanged and run it at their end.
FINISH_TIMERS_STEP = "timers.finish"
APPROVAL_TIMERS = [DEADLINE_WORKFLOW, ESCALATION_WORKFLOW]
#: DBOS dequeues a queue by priority, then age. Decisions and continuations are enqueued without one
#: (DBOS stores 0, the first), timers with this: a decision never waits behind deadlines falling due,
#: though every deadline was enqueued (when its refund parked) before any decision on it.
TIMER_PRIORITY = 100


def _enqueue(name: str, workflow_id: str, *args: Any) -> None:
    options: EnqueueOptions = {"queue_name": APPROVAL_QUEUE, "workflow_name": name, "workflow_id": workflow_id}
    DBOS.enqueue_workflow_with_options(options, *args)


async def enqueue_timer(name: str, workflow_id: str, *args: Any, delay: float) -> None:
    """A version-less DELAYED workflow on the approvals queue, behind decisions and continuations."""
    options: EnqueueOptions = {
        "queue_name": APPROVAL_QUEUE,
        "workflow_name": name,
        "workflow_id": workflow_id,
        "delay_seconds": max(delay, 0.0),
        "priority": TIMER_PRIORITY,
    }
    await DBOS.enqueue_workflow_with_options_async(options, *args)


async def start_timers(request: ApprovalRequest, config: ApprovalSettings) -> None:
    """From the refund workflow: the deadline (and the reminder before it) as DELAYED workflows.

    Delays are taken from the recorded request, not from a clock, so a replay computes the same ones."""
    refund_id, amount, currency = request.refund_id, str(request.amount), request.currency
    expires_in = (request.expires_at - request.requested_at).total_seconds()
    await enqueue_timer(DEADLINE_WORKFLOW, deadline_id(refund_id), refund_id, amount, currency, delay=expires_in)
    escalates_in = (request.escalate_at - request.requested_at).total_seconds()
    if escalates_in < expires_in:
        expires = request.expires_at.isoformat()
        await enqueue_timer(
            ESCALATION_WORKFLOW, escalation_id(refund_id), refund_id, amount, currency, expires, delay=escalates_in
        )


@DBOS.step(name=FINISH_TIMERS_STEP)
def finish_timers_step(refund_id: str, names: list[str]) -> list[str]:
    """The refund is decided: its timers named ``names`` that still wait (DELAYED) become due now, so each runs,
    finds the decision and ends, instead of waiting for a moment that no longer matters. Returns their ids.

    Idempotent (a timer already due, running or ended is left as it is), so a retry or a replay is harmless; the
    ids are checked here, not only by the listing's prefix match, which ``_`` in another refund's id could widen."""
    prefix = f"{refund_id}/"
    waiting = DBOS.list_workflows(
        workflow_id_prefix=prefix, status="DELAYED", name=names, load_input=False, load_output=False
    )
    due = [wf.workflow_id for wf in waiting if wf.workflow_id.startswith(prefix)]
    for workflow_id in due:
        DBOS.set_workflow_delay(workflow_id, delay_seconds=0)
    return due


def hand_over(standing: ApprovalRecord) -> None:
    """Start the refund's continuation and send it the decision that stands (both deduplicated by id/key)."""
    refund_id = standing.refund_id
    _enqueue(SETTLE_WORKFLOW, settle_id(refund_id), refund_id)
    crash_point("after_continuation_enqueued")
    DBOS.send(
        settle_id(refund_id), standing.model_dump(mode="json"), APPROVAL_TOPIC, idempotency_key=f"approval:{refund_id}"
    )
    crash_point("after_decision_sent")


@DBOS.workflow(name=DECISION_WORKFLOW)
def approval_decision_workflow(refund_id: str, decision: dict[str, Any]) -> dict[str, Any]:
    """A person's decision: recorded (first writer wins), then handed to the refund's continuation."""
    standing = record_decision_step(ApprovalRecord.model_validate(decision))
    crash_point("after_decision_recorded")
    if standing.decision != "expired":  # an expiry that won the race has finished the refund already
        hand_over(standing)
    finish_timers_step(refund_id, APPROVAL_TIMERS)  # decided: the deadline and the reminder end now
    return standing.model_dump(mode="json")


@DBOS.workflow(name=DEADLINE_WORKFLOW)
def approval_deadline_workflow(refund_id: str, amount: str, currency: str) -> dict[str, Any] | None:
    """Due at the approval's expiry: with no decision, the refund ends rejected; a decision that won stands."""
    value = Decimal(amount)
    standing = expire_approval_step(
        refund_id, amount=value, currency=currency, detail=EXPIRED_DETAIL, reply=replies.expired(value, currency)
    )
    if standing.decision == "expired":
        finish_timers_step(refund_id, [ESCALATION_WORKFLOW])  # a reminder still waiting ends with the refund
        return {"refund_id": refund_id, "status": "rejected", "detail": EXPIRED_DETAIL}
    hand_over(standing)  # already done by the decision workflow; repeated harmlessly as a safety net
    return None


@DBOS.workflow(name=ESCALATION_WORKFLOW)
def approval_escalation_workflow(refund_id: str, amount: str, currency: str, expires_at: str) -> bool:
    """Due at the escalation time: remind approvers once, unless the refund was decided meanwhile."""
    claims = tokens.ApprovalClaims(
        refund_id=refund_id,
        amount=Decimal(amount),
        currency=currency,
        expires_at=datetime.fromisoformat(expires_at),
        approver="",  # each approver's link is bound to them
    )
    links = approver_links(current().approvals, claims)
    return escalate_approval_step(
        refund_id, messages={name: escalation_text(claims, url) for name, url in links.items()}
    )


def decide_here(record: ApprovalRecord) -> ApprovalRecord:
    """Run the refund's decision workflow in this process (DBOS launched here) and return what it recorded.

    Concurrent and repeated calls meet the one run under the refund's decision id and get its result."""
    with SetWorkflowID(decision_id(record.refund_id)):
        handle = DBOS.start_workflow(approval_decision_workflow, record.refund_id, record.model_dump(mode="json"))
    return ApprovalRecord.model_validate(handle.get_result())
