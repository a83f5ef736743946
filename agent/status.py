"""A refund's state as callers see it, across its workflows: phase, amounts, approval, payment, step timeline.

A refund is up to five workflows (``agent.approvals.family``): the one that decides, the decision,
the continuation that pays, and the deadline and reminder timers; plus any fork an operator made.
The refund's row says where it is (each step writes it with its effect); the workflows say whether
something is running, stopped, or finished and with which outcome.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from dbos import DBOSClient, WorkflowStatus

from agent.approvals import deadline_id, escalation_id, family, request_view, settle_id
from agent.claims import claim_view
from agent.questions import expiry_id, rejudge_id, reminder_id
from agent.questions import ids as question_ids
from agent.settlement import settlement_prefix
from steps.approval_book import approval_request, recorded_decision
from steps.notify import customer_message
from steps.questions import Question, question_of
from steps.records import from_minor
from steps.settlement import amounts_paid
from steps.store import app_db, refunds, utc

if TYPE_CHECKING:
    from agent.settings import ModelPrice

_TERMINAL = {"CANCELLED": "cancelled", "ERROR": "failed", "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed"}
_ACTIVE = ("ENQUEUED", "PENDING", "DELAYED")
FINAL = ("completed", "rejected", "failed", "cancelled")


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with ``Z``, the one form the API and the CLI give times in (no zone stored: UTC)."""
    return utc(moment).isoformat().replace("+00:00", "Z")


def _ms(value: int | None) -> str | None:
    return rfc3339(datetime.fromtimestamp(value / 1000, UTC)) if value else None


_REQUEST_TIMES = ("requested_at", "escalate_at", "expires_at", "escalated_at")


def _request(request: Any) -> dict[str, Any]:
    """The approval request as the API shows it (its times in the API's one form)."""
    view = request_view(request)
    return {k: rfc3339(datetime.fromisoformat(v)) if k in _REQUEST_TIMES and v else v for k, v in view.items()}


def workflows_of(client: DBOSClient, refund_id: str) -> list[WorkflowStatus]:
    """The refund's workflows (its settlement's too) and their forks, oldest first."""
    found = client.list_workflows(
        workflow_ids=family(refund_id) + question_ids(refund_id), load_input=False, load_output=True
    )
    if found:  # and the settlement of a refund the provider settled later (agent/settlement.py)
        found += client.list_workflows(
            workflow_id_prefix=settlement_prefix(refund_id), load_input=False, load_output=True
        )
        ids = [wf.workflow_id for wf in found]
        found += client.list_workflows(forked_from=ids, load_input=False, load_output=True)
    return sorted(found, key=lambda wf: (wf.created_at or 0, wf.workflow_id))


def speaking(workflows: list[WorkflowStatus], refund_id: str) -> WorkflowStatus | None:
    """The run that carries the refund now: the newest fork, else the continuation, else the deciding run."""
    by_id = {wf.workflow_id: wf for wf in workflows}
    forks = [wf for wf in workflows if wf.forked_from]
    if forks:
        return forks[-1]
    return by_id.get(settle_id(refund_id)) or by_id.get(rejudge_id(refund_id)) or by_id.get(refund_id)


def outcome_of(workflows: list[WorkflowStatus]) -> dict[str, Any] | None:
    """The outcome the refund ended with: the result of the run that finished it, newest first."""
    for wf in reversed(workflows):
        out = wf.output if wf.status == "SUCCESS" else None
        if isinstance(out, dict) and out.get("status") in FINAL:
            return out
    return None


def step_timeline(client: DBOSClient, workflows: list[WorkflowStatus]) -> list[dict[str, Any]]:
    timeline: list[dict[str, Any]] = []
    for wf in workflows:
        for step in client.list_workflow_steps(wf.workflow_id, load_output=False):
            start, end = step["started_at_epoch_ms"], step["completed_at_epoch_ms"]
            timeline.append(
                {
                    "workflow": wf.workflow_id,
                    "step": step["function_id"],
                    "name": step["function_name"],
                    "start": _ms(start),
                    "end": _ms(end),
                    "duration_ms": (end - start) if start and end else None,
                    "error": repr(step["error"]) if step["error"] is not None else None,
                }
            )
    return timeline


def phase_of(
    workflows: list[WorkflowStatus], refund_id: str, row_status: str | None, decision: str | None
) -> tuple[str, dict[str, Any] | None]:
    """The refund's phase and, once it ended, its outcome."""
    outcome = outcome_of(workflows)
    if outcome is not None:
        return str(outcome["status"]), outcome
    current = speaking(workflows, refund_id)
    if current is not None and current.status in _TERMINAL:
        return _TERMINAL[current.status], None
    phase = row_status or "received"
    running = current is not None and current.status in _ACTIVE
    # "cancelled" while running: resumed or forked by hand after a console cancel.
    if phase in ("received", "cancelled") and running:
        phase = "deciding"
    if phase == "awaiting_approval" and decision is not None:  # decided; the continuation is on its way
        phase = "paying" if decision == "approve" else "deciding"
    return phase, None


def _timer(workflows: list[WorkflowStatus], workflow_id: str) -> dict[str, Any] | None:
    wf = next((w for w in workflows if w.workflow_id == workflow_id), None)
    if wf is None:
        return None
    return {"workflow_id": wf.workflow_id, "status": wf.status, "due_at": _ms(wf.delay_until_epoch_ms)}


def minor_text(minor: int | None, currency: str | None) -> str | None:
    """An amount stored in minor units as the API gives money (``"300.00"``); None when there is none."""
    return str(from_minor(minor, currency)) if minor is not None and currency else None


def amounts_refunded(conn: sa.Connection, rows: Iterable[Any]) -> dict[str, Decimal]:
    """What each of the refunds' ``rows`` paid, in one read: the amount booked when it completed. A refund not in
    the answer paid nothing (not yet, refused, failed, or reversed): never a 0 that reads as a refund."""
    held = {r.refund_id: (r.provider_refund_id, r.currency) for r in rows if r.status == "completed"}
    return amounts_paid(conn, held)


def usage_view(row: Any, prices: Mapping[str, ModelPrice] | None) -> dict[str, Any] | None:
    """What deciding the refund cost at the model; with a price for the model, in money too."""
    if row is None or row.model_requests is None:
        return None
    price = (prices or {}).get(row.model or "")
    cost = price.cost(row.input_tokens or 0, row.output_tokens or 0) if price else None
    return {
        "model": row.model,
        "requests": row.model_requests,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "cost": {"amount": str(cost), "currency": price.currency} if price and cost is not None else None,
    }


def refund_status(
    client: DBOSClient, refund_id: str, *, prices: Mapping[str, ModelPrice] | None = None
) -> dict[str, Any] | None:
    """``prices``: per model, what its tokens cost (settings); without one the usage has no cost."""
    with app_db().engine.connect() as conn:
        row = conn.execute(sa.select(refunds).where(refunds.c.refund_id == refund_id)).first()
        decision = recorded_decision(conn, refund_id)
        request = approval_request(conn, refund_id)
        message = customer_message(conn, refund_id)
        paid = amounts_refunded(conn, [row] if row else []).get(refund_id)
        asked = question_of(conn, refund_id)
    workflows = workflows_of(client, refund_id)
    if row is None and not workflows:
        return None
    decided = decision.decision if decision else None
    phase, outcome = phase_of(workflows, refund_id, row.status if row else None, decided)
    current = speaking(workflows, refund_id)
    currency = row.currency if row else None
    amount_minor = (row.proposed_amount_minor or row.requested_amount_minor) if row else None
    return {
        "refund_id": refund_id,
        "status": phase,
        "order_id": row.order_id if row else None,
        "requested_by": row.requested_by if row else None,
        "requester_operator": row.requester_operator if row else None,
        "amount": str(from_minor(amount_minor, currency)) if amount_minor is not None and currency else None,
        "amount_requested": minor_text(row.requested_amount_minor, currency) if row else None,
        "amount_refunded": str(paid) if paid is not None else None,
        "currency": currency,
        "verdict": row.verdict if row else None,
        "reason": row.reason if row else None,
        "customer_reply": row.customer_reply if row else None,  # the model's draft; what was sent: customer_message
        "customer_message": message and {**message, "sent_at": rfc3339(datetime.fromisoformat(message["sent_at"]))},
        "model": row.model if row else None,
        "claim": claim_view(row.claim_category if row else None, row.evidence if row else None).model_dump(mode="json"),
        "usage": usage_view(row, prices),
        "approval": {
            "request": _request(request) if request else None,
            "decision": decision.decision if decision else None,
            "approved_amount": str(decision.amount) if decision and decision.decision == "approve" else None,
            "approver": decision.approver if decision else None,
            "via": decision.via if decision else None,
            "decided_at": rfc3339(decision.decided_at) if decision else None,
            "deadline": _timer(workflows, deadline_id(refund_id)),
            "escalation": _timer(workflows, escalation_id(refund_id)),
        }
        if request or decision
        else None,
        "question": question_view(asked, workflows) if asked else None,
        "payment": {
            "provider_refund_id": row.provider_refund_id if row else None,
            "idempotency_key": row.idempotency_key if row else None,
            "provider_status": row.provider_status if row else None,
            "failure_reason": row.provider_failure_reason if row else None,
        },
        "outcome": outcome,
        "executor_id": current.executor_id if current else None,
        "workflows": [
            {
                "workflow_id": wf.workflow_id,
                "name": wf.name,
                "status": wf.status,
                "created_at": _ms(wf.created_at),
                "due_at": _ms(wf.delay_until_epoch_ms) if wf.status == "DELAYED" else None,
                "executor_id": wf.executor_id,
                "app_version": wf.app_version,
            }
            for wf in workflows
        ],
        "steps": step_timeline(client, workflows),
    }


def question_view(asked: Question, workflows: list[WorkflowStatus]) -> dict[str, Any]:
    """What the refund asked its customer, by when, and what became of it (the answer's words are not shown here)."""
    answer = asked.answer
    return {
        "kind": asked.question,
        "state": asked.state,
        "asked_at": rfc3339(asked.asked_at),
        "remind_at": rfc3339(asked.remind_at),
        "expires_at": rfc3339(asked.expires_at),
        "reminded_at": rfc3339(asked.reminded_at) if asked.reminded_at else None,
        "answered_at": rfc3339(asked.answered_at) if asked.answered_at else None,
        "answered_via": answer.via if answer else None,
        "files": [{"content_type": f.content_type, "size": f.size, "sha256": f.sha256} for f in answer.files]
        if answer
        else [],
        "reminder": _timer(workflows, reminder_id(asked.refund_id)),
        "deadline": _timer(workflows, expiry_id(asked.refund_id)),
    }


def wait_for_outcome(
    client: DBOSClient, refund_id: str, *, timeout: float = 120.0, interval: float = 0.2
) -> dict[str, Any]:
    """Poll until the refund has ended (paid, refused, failed or cancelled); its outcome, or a TimeoutError. Each
    look is three reads of the system database, so ``interval`` is what a wait costs the database per second."""
    deadline = time.monotonic() + timeout
    while True:
        workflows = workflows_of(client, refund_id)
        outcome = outcome_of(workflows)
        if outcome is not None:
            return outcome
        current = speaking(workflows, refund_id)
        if current is not None and current.status in _TERMINAL:
            return {"refund_id": refund_id, "status": _TERMINAL[current.status], "workflow": current.status}
        if time.monotonic() > deadline:
            raise TimeoutError(f"refund {refund_id} did not end within {timeout:.0f}s")
        time.sleep(interval)


def parked(client: DBOSClient, refund_id: str) -> dict[str, Any] | None:
    """The pending approval request once the refund has parked: its deciding run ended and its deadline is set."""
    with app_db().engine.connect() as conn:
        request = approval_request(conn, refund_id)
        if request is None or recorded_decision(conn, refund_id) is not None:
            return None
    found = {wf.workflow_id: wf for wf in client.list_workflows(workflow_ids=[refund_id, deadline_id(refund_id)])}
    deciding, deadline = found.get(refund_id), found.get(deadline_id(refund_id))
    if deciding is None or deciding.status != "SUCCESS" or deadline is None:
        return None
    return request_view(request)
