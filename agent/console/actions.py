"""Operators' admin actions on a refund's workflow: cancel, resume, fork. Each lands in the audit log, with the
operator and the client address it came from."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from dbos import DBOSClient

from agent.approvals import APPROVAL_QUEUE, pending_request
from agent.legacy import LEGACY_REFUND_WORKFLOW
from agent.status import speaking, workflows_of
from agent.workflow import REFUND_QUEUE, REFUND_WORKFLOW
from steps import audit
from steps.store import app_db, refunds

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


def _refusal(wf: Any, refund_id: str, action: Action) -> str | None:
    if action == "cancel":
        if wf.status == "SUCCESS" and pending_request(refund_id) is not None:
            return (
                f"refund {refund_id} is waiting for an approval and nothing of it runs until a decision or its "
                "deadline: reject it to end it"
            )
        if wf.status in (*FINISHED, "CANCELLED"):
            return f"refund {refund_id} is {wf.status.lower()}; only a running refund can be cancelled"
        return None
    if action == "resume":
        if wf.status in FINISHED:
            return f"refund {refund_id} has finished; fork it from a step to run part of it again"
        if wf.status not in RESUMABLE:  # resuming a running workflow would start a second execution of it
            return f"refund {refund_id} is {wf.status.lower()}; only a cancelled or stuck refund is resumed"
        return None
    if wf.status in ("ENQUEUED", "PENDING", "DELAYED"):
        return f"refund {refund_id} is still running; cancel it before forking it"
    with app_db().engine.connect() as conn:
        paid = conn.execute(sa.select(refunds.c.provider_refund_id).where(refunds.c.refund_id == refund_id)).scalar()
    if paid:
        return f"refund {refund_id} was paid (provider refund {paid}); a fork would only replay that payment"
    return None


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
