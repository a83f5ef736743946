"""A refund's state as callers see it: phase, amounts, approval, payment and the DBOS step timeline."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from dbos import DBOSClient, WorkflowStatus

from agent.approvals import APPROVAL_EVENT
from agent.domain import OUTCOME_EVENT, PHASE_EVENT
from steps.records import from_minor
from steps.refunds import recorded_decision
from steps.store import app_db, refunds

_TERMINAL = {"CANCELLED": "cancelled", "ERROR": "failed", "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed"}
_RUNNING = ("PENDING", "DELAYED")


def _ms(value: int | None) -> str | None:
    return datetime.fromtimestamp(value / 1000, UTC).isoformat() if value else None


def step_timeline(client: DBOSClient, refund_id: str) -> list[dict[str, Any]]:
    return [
        {
            "step": step["function_id"],
            "name": step["function_name"],
            "start": _ms(step["started_at_epoch_ms"]),
            "end": _ms(step["completed_at_epoch_ms"]),
            "duration_ms": (end - start)
            if (start := step["started_at_epoch_ms"]) and (end := step["completed_at_epoch_ms"])
            else None,
            "error": repr(step["error"]) if step["error"] is not None else None,
        }
        for step in client.list_workflow_steps(refund_id, load_output=False)
    ]


def phase_of(
    client: DBOSClient, workflow: WorkflowStatus | None, row_status: str | None, *, pending: object
) -> tuple[str, Any]:
    """A workflow's phase and outcome as callers see them.

    Refunds publish their phase in the refund's row, in the same transaction as each step's effect,
    and their outcome as the workflow's result; refunds started before the lean-checkpoints patch also
    published both as events, which still count. ``pending`` is the approval request event, if any:
    the row says ``awaiting_approval`` a moment before the request it refers to is published.
    """
    if workflow is None:
        return row_status or "received", None
    if workflow.status in _TERMINAL:
        return _TERMINAL[workflow.status], None
    outcome = workflow.output if workflow.status == "SUCCESS" and isinstance(workflow.output, dict) else None
    outcome = outcome or client.get_event(workflow.workflow_id, OUTCOME_EVENT, timeout_seconds=0)
    if isinstance(outcome, dict) and outcome.get("status"):
        return str(outcome["status"]), outcome
    event = client.get_event(workflow.workflow_id, PHASE_EVENT, timeout_seconds=0)
    phase = row_status or "received"
    # "cancelled" while running: resumed or forked by hand after a console cancel.
    if phase in ("received", "cancelled") and workflow.status in _RUNNING:
        phase = "deciding"
    if phase == "awaiting_approval" and not pending:
        phase = "deciding"
    return (str(event) if event and phase in ("received", "deciding") else phase), None


def refund_status(client: DBOSClient, refund_id: str) -> dict[str, Any] | None:
    with app_db().engine.connect() as conn:
        row = conn.execute(sa.select(refunds).where(refunds.c.refund_id == refund_id)).first()
        decision = recorded_decision(conn, refund_id)
    workflows = client.list_workflows(workflow_ids=[refund_id], load_input=False, load_output=True)
    if row is None and not workflows:
        return None
    pending = client.get_event(refund_id, APPROVAL_EVENT, timeout_seconds=0)
    # The newest run speaks for the refund: a fork carries on where its original stopped.
    forks = client.list_workflows(forked_from=refund_id, load_input=False, load_output=True) if workflows else []
    latest = max(forks, key=lambda wf: wf.created_at or 0) if forks else (workflows[0] if workflows else None)
    phase, outcome = phase_of(client, latest, row.status if row else None, pending=pending)
    currency = row.currency if row else None
    amount_minor = (row.proposed_amount_minor or row.requested_amount_minor) if row else None
    return {
        "refund_id": refund_id,
        "status": phase,
        "order_id": row.order_id if row else None,
        "amount": str(from_minor(amount_minor, currency)) if amount_minor is not None and currency else None,
        "currency": currency,
        "verdict": row.verdict if row else None,
        "reason": row.reason if row else None,
        "customer_reply": row.customer_reply if row else None,
        "model": row.model if row else None,
        "approval": {
            "requested": pending,
            "decision": decision.decision if decision else None,
            "approver": decision.approver if decision else None,
            "decided_at": decision.decided_at.isoformat() if decision else None,
        }
        if pending or decision
        else None,
        "payment": {
            "provider_refund_id": row.provider_refund_id if row else None,
            "idempotency_key": row.idempotency_key if row else None,
        },
        "outcome": outcome,
        "executor_id": latest.executor_id if latest else None,
        "steps": step_timeline(client, refund_id) if workflows else [],
    }
