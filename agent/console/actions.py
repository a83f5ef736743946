"""Operators' admin actions on a refund's workflow: cancel, resume, fork. Each lands in the audit log, with the
operator and the client address it came from."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from dbos import DBOSClient

from agent.approvals import APPROVAL_QUEUE
from agent.console.phases import phase_of
from agent.legacy import LEGACY_REFUND_WORKFLOW
from agent.status import speaking, workflows_of
from agent.workflow import REFUND_QUEUE, REFUND_WORKFLOW
from steps import audit
from steps.store import app_db, approval_decisions, refunds

Action = Literal["cancel", "resume", "fork"]
FINISHED = ("SUCCESS", "ERROR")
RESUMABLE = ("CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")


class ActionError(Exception):
    """The action does not apply to the refund as it is now."""


def _workflow(client: DBOSClient, refund_id: str) -> Any:
    """The run that carries the refund now (the deciding run, its continuation, or the newest fork)."""
    found = speaking(workflows_of(client, refund_id), refund_id)
    if found is None:
        raise ActionError(f"refund {refund_id} has no workflow")
    return found


def _queue(wf: Any) -> str:
    """The queue the run came from (a finished run's row may no longer name it)."""
    if wf.queue_name:
        return str(wf.queue_name)
    return REFUND_QUEUE if wf.name in (REFUND_WORKFLOW, LEGACY_REFUND_WORKFLOW) else APPROVAL_QUEUE


def _record(refund_id: str, event: str, payload: dict[str, Any], status: str | None = None) -> None:
    """Append the action to the audit log; a new ``status`` for the refund's row keeps the one it replaces."""
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        if status is not None:
            before = conn.execute(sa.select(refunds.c.status).where(refunds.c.refund_id == refund_id)).scalar()
            payload = {**payload, "status_before": before}
            conn.execute(refunds.update().where(refunds.c.refund_id == refund_id).values(status=status, updated_at=now))
        audit.append(conn, refund_id=refund_id, event=event, payload=payload, now=now)


def _status_before_cancel(refund_id: str) -> str | None:
    with app_db().engine.connect() as conn:
        cancelled = [e for e in audit.entries(conn, refund_id) if e.event == "operator_cancelled"]
    before = cancelled[-1].payload.get("status_before") if cancelled else None
    return str(before) if before else None


def refusal(client: DBOSClient, refund_id: str, action: Action) -> str | None:
    """Why ``action`` does not apply to the refund as it is now; None when it does (the page offers it)."""
    try:
        wf = _workflow(client, refund_id)
    except ActionError as error:
        return str(error)
    return _refusal(wf, refund_id, action)


def _standing(refund_id: str) -> tuple[str, str | None, str | None]:
    """The refund's phase (``agent.console.phases``), its provider refund if the provider made one, and that
    refund's status as last read."""
    with app_db().engine.connect() as conn:
        row = conn.execute(
            sa.select(
                refunds.c.status, refunds.c.provider_refund_id, refunds.c.provider_status, approval_decisions.c.decision
            )
            .outerjoin(approval_decisions, approval_decisions.c.refund_id == refunds.c.refund_id)
            .where(refunds.c.refund_id == refund_id)
        ).first()
    if row is None:
        return "deciding", None, None
    return phase_of(row.status, row.decision).key, row.provider_refund_id, row.provider_status


# Why an action does not apply, in the words a support lead uses, by the refund's phase.
ENDED = {
    "paid": "this refund is already paid",
    "refused": "this refund was refused, so there is nothing to pay",
    "expired": "this refund expired unanswered, so there is nothing to pay",
}
PAYMENT_PHASES = ("paying", "settling")


def _refusal(wf: Any, refund_id: str, action: Action) -> str | None:
    phase, paid, provider_status = _standing(refund_id)
    running = wf.status in ("ENQUEUED", "PENDING", "DELAYED")
    if phase == "asking":
        return (
            "this refund is waiting for its customer's answer, and nothing of it runs until the answer or its "
            "deadline: end the wait, or send it to a person"
        )
    if action == "cancel":
        if phase == "parked":
            return (
                "this refund is waiting for an approver, and nothing of it runs until a decision or its "
                "deadline: reject it to end it"
            )
        if phase in ENDED and not running:
            return ENDED[phase]
        if wf.status == "CANCELLED" or phase == "cancelled":
            return "this refund is already stopped"
        if wf.status in FINISHED:
            return "this refund has ended"
        return None
    if action == "resume":
        if wf.status in RESUMABLE:
            return None
        if phase in ENDED:
            return ENDED[phase]
        if phase == "parked":
            return "this refund is waiting for an approver; resuming applies to a stopped or stuck refund"
        if wf.status in FINISHED:
            return "this refund has ended"
        # resuming a running workflow would start a second execution of it
        return "this refund is running; only a stopped or stuck refund is resumed"
    if phase == "paid":
        return f"this refund is already paid (provider refund {paid}); a retry would only replay that payment"
    if phase == "failed" and paid is not None:
        # Its key belongs to a refund the provider made and then failed: replaying it pays nothing new.
        return (
            f"the provider made this refund ({paid}) and it then {provider_status or 'failed'}; a retry would only "
            "replay that payment's key. To pay the customer, submit a new refund for the order: it is judged and "
            "paid under its own key"
        )
    if running:
        return "this refund is still running; stop it before retrying its payment"
    if phase in ENDED:
        return ENDED[phase]
    if phase == "parked":
        return "this refund is waiting for an approver; there is no payment to retry"
    stopped_while_paying = phase == "cancelled" and _status_before_cancel(refund_id) in PAYMENT_PHASES
    if phase == "failed" or stopped_while_paying or wf.status in ("ERROR", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
        return None
    return "there is no failed or interrupted payment to retry"


def cancel(client: DBOSClient, refund_id: str, *, operator: str, address: str) -> None:
    """Stop the workflow where it is; nothing it has not done yet happens until someone resumes it."""
    wf = _workflow(client, refund_id)
    refused = _refusal(wf, refund_id, "cancel")
    if refused:
        raise ActionError(refused)
    client.cancel_workflow(wf.workflow_id)
    _record(
        refund_id,
        "operator_cancelled",
        {"operator": operator, "address": address, "workflow_status": wf.status},
        "cancelled",
    )


def resume(client: DBOSClient, refund_id: str, *, operator: str, address: str) -> None:
    """Continue a cancelled (or stuck) workflow from its last checkpoint, on the refunds queue."""
    wf = _workflow(client, refund_id)
    refused = _refusal(wf, refund_id, "resume")
    if refused:
        raise ActionError(refused)
    client.resume_workflow(wf.workflow_id, queue_name=_queue(wf))
    # The row shows where the refund was when it was cancelled (a resumed step that runs again updates it).
    phase = _status_before_cancel(refund_id)
    payload = {"operator": operator, "address": address, "workflow_id": wf.workflow_id}
    _record(refund_id, "operator_resumed", payload, phase or "received")


def fork(client: DBOSClient, refund_id: str, *, step: int, operator: str, address: str, app_version: str) -> str:
    """Run the workflow again from ``step`` under a new workflow id; earlier steps keep their results.

    The refund id is the workflow's input, so the payment step derives the same idempotency key and
    the provider replays a refund it already made instead of paying twice."""
    wf = _workflow(client, refund_id)
    refused = _refusal(wf, refund_id, "fork")
    if refused:
        raise ActionError(refused)
    with app_db().engine.connect() as conn:
        row = conn.execute(sa.select(refunds.c.status).where(refunds.c.refund_id == refund_id)).first()
    steps = {s["function_id"] for s in client.list_workflow_steps(wf.workflow_id, load_output=False)}
    if step < 1 or (step > 1 and step not in steps):
        raise ActionError(f"refund {refund_id} has no step {step}")
    handle = client.fork_workflow(wf.workflow_id, step, application_version=app_version, queue_name=_queue(wf))
    fork_id = str(handle.get_workflow_id())
    # A refund cancelled here shows "cancelled" in its row; the fork carries on from where it stood, as a resume does.
    restored = _status_before_cancel(refund_id) if row is not None and row.status == "cancelled" else None
    payload = {
        "operator": operator,
        "address": address,
        "from_step": step,
        "forked": wf.workflow_id,
        "fork_workflow_id": fork_id,
    }
    _record(refund_id, "operator_forked", payload, restored)
    return fork_id
