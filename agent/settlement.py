"""Refunds the provider settles later: parked as rows until a webhook or a scheduled re-read says how it ended.

A Stripe refund can stay ``pending`` (or ``requires_action``) for days and then succeed or fail. Such a
refund parks the way approvals do: its row says ``settling`` and keeps the reservation, and a DELAYED
check workflow (``<key>/payment-check-<n>``, version-less, on the approvals queue) re-reads it when due.
A verified ``refund.updated`` / ``refund.failed`` webhook whose refund matches the row enqueues
``<key>/payment-event-<event id>`` at once. Whichever reads a final status first settles the row
(steps/settlement.py); the others find it settled. A paid refund the provider fails later
(``succeeded`` -> ``failed``, which Stripe allows) is reversed once, from its ``refund.failed`` webhook.

Neither path trusts what an event names: both re-read the provider refund the row holds and judge it
against the row (``steps.settlement.judge``) before anything is booked; every event's outcome is recorded
(steps/provider_events.py) and counted in /metrics.
"""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS, EnqueueOptions

from agent import replies
from agent.approval_workflows import enqueue_timer, finish_timers_step
from agent.approvals import APPROVAL_QUEUE
from agent.context import current
from agent.domain import Phase
from agent.ops.offloop import call
from steps.faults import crash_point
from steps.notify import CustomerMessage, slack_enabled, slack_operators_step
from steps.payments import fetch_refund_step
from steps.provider_events import Outcome, ProviderEvent, record_provider_event_step, safe_event_type, safe_id
from steps.records import ProviderRefund
from steps.settlement import (
    SettlingPayment,
    judge,
    park_payment_step,
    reverse_payment_step,
    settle_payment_step,
    settling_payment_step,
    standing,
)

log = logging.getLogger(__name__)

# Durable names: recorded with every workflow; never rename them.
PAYMENT_CHECK_WORKFLOW = "payment_check_workflow"
PAYMENT_EVENT_WORKFLOW = "payment_event_workflow"


def settlement_prefix(refund_id: str) -> str:
    """Every settlement workflow of a refund starts with this ('/' never appears in a refund id)."""
    return f"{refund_id}/payment-"


def check_id(refund_id: str, n: int) -> str:
    return f"{settlement_prefix(refund_id)}check-{n}"


def event_workflow_id(refund_id: str, provider_event_id: str) -> str:
    """One settlement per provider event: a redelivered event is dropped; another event about the same refund
    (Stripe sends refund.updated and refund.failed for one failure) runs, and finds it settled."""
    return f"{settlement_prefix(refund_id)}event-{provider_event_id}"


def event_options(refund_id: str, provider_event_id: str) -> EnqueueOptions:
    """How the webhook enqueues a settlement: version-less, deduplicated by refund and provider event."""
    return {
        "queue_name": APPROVAL_QUEUE,
        "workflow_name": PAYMENT_EVENT_WORKFLOW,
        "workflow_id": event_workflow_id(refund_id, provider_event_id),
    }


async def _schedule_check(refund_id: str, n: int) -> None:
    delay = current().settings.payments.recheck_seconds
    await enqueue_timer(PAYMENT_CHECK_WORKFLOW, check_id(refund_id, n), refund_id, n, delay=delay)


async def park_payment(refund_id: str, payment: ProviderRefund) -> dict[str, Any]:
    """From the paying workflow: the provider has not settled; keep the reservation, wait as rows, end."""
    parked = await call(park_payment_step, refund_id, payment)
    crash_point("after_payment_parked")
    if parked:
        await _schedule_check(refund_id, 1)
    return {
        "refund_id": refund_id,
        "status": Phase.SETTLING.value,
        "provider_refund_id": payment.provider_refund_id,
        "provider_status": payment.status,
        "idempotency_key": payment.idempotency_key,
    }


async def settle(
    settling: SettlingPayment, payment: ProviderRefund, *, event: ProviderEvent | None = None
) -> dict[str, Any]:
    """Book the provider's final answer once: paid and the customer told, or failed and operators alerted.

    ``event``: the re-read or webhook that learned it (the step judges the payment against the row again);
    None from the paying workflow, for the payment its own step made."""
    refund_id = settling.refund_id
    succeeded = payment.status == "succeeded"
    paid = replies.paid(payment.amount, payment.currency)
    notify = CustomerMessage(settling.customer_id, paid) if succeeded else None
    alert = None
    if not succeeded:
        reason = f" ({payment.failure_reason})" if payment.failure_reason else ""
        alert = (
            f"Refund {refund_id}: the provider's refund {payment.provider_refund_id} {payment.status}{reason}. "
            f"Nothing was sent to the customer; the order's {payment.amount} {payment.currency} is refundable again."
        )
    changed = await call(settle_payment_step, refund_id, payment, notify=notify, alert=alert, event=event)
    crash_point("after_payment_settled")
    if not changed:  # settled first by another path, or (an event's) refused: the row says which
        return {"refund_id": refund_id, "status": "settled", "provider_status": payment.status, "settled_here": False}
    if not succeeded:
        log.error("refund %s: provider refund %s %s", refund_id, payment.provider_refund_id, payment.status)
        if alert is not None and slack_enabled():
            await call(slack_operators_step, refund_id, text=alert)
    if event is not None and event.source == "webhook":  # the re-read still waiting ends now (the last step)
        await call(finish_timers_step, refund_id, [PAYMENT_CHECK_WORKFLOW])
    status = Phase.COMPLETED if succeeded else Phase.FAILED
    return {
        "refund_id": refund_id,
        "status": status.value,
        "provider_refund_id": payment.provider_refund_id,
        "provider_status": payment.status,
        "failure_reason": payment.failure_reason,
        "amount": str(payment.amount),
        "currency": payment.currency,
        "idempotency_key": payment.idempotency_key,
        "settled_here": True,
    }


async def reverse(paid: SettlingPayment, payment: ProviderRefund, event: ProviderEvent) -> dict[str, Any]:
    """The provider failed a refund it had paid: record it failed, release what was booked, alert operators; once."""
    refund_id = paid.refund_id
    reason = f" ({payment.failure_reason})" if payment.failure_reason else ""
    alert = (
        f"Refund {refund_id}: the provider's refund {payment.provider_refund_id} {payment.status}{reason} after it "
        f"had succeeded. The customer was told it was paid; the order's {paid.amount} {paid.currency} is "
        "refundable again."
    )
    if not await call(reverse_payment_step, refund_id, payment, alert=alert, event=event):
        return {"refund_id": refund_id, "status": "settled", "provider_status": payment.status, "settled_here": False}
    log.error(
        "refund %s: provider refund %s %s after it was paid", refund_id, payment.provider_refund_id, payment.status
    )
    if slack_enabled():
        await call(slack_operators_step, refund_id, text=alert)
    return {
        "refund_id": refund_id,
        "status": Phase.FAILED.value,
        "reversed": True,
        "provider_refund_id": payment.provider_refund_id,
        "provider_status": payment.status,
        "failure_reason": payment.failure_reason,
        "amount": str(paid.amount),
        "currency": paid.currency,
        "idempotency_key": paid.idempotency_key,
        "settled_here": True,
    }


async def _note(event: ProviderEvent, refund_id: str | None, outcome: Outcome, reason: str) -> None:
    await call(record_provider_event_step, event, refund_id=refund_id, outcome=outcome, reason=reason)


async def _read_and_settle(refund_id: str, event: ProviderEvent, next_check: int | None) -> dict[str, Any]:
    """Re-read the provider refund the ROW holds (never one an event names), judge it against the row, then
    settle it, reverse a paid one (webhooks only), or change nothing and say why."""
    reversible = event.source == "webhook"
    row = await call(settling_payment_step, refund_id)
    unable = standing(row, reversible=reversible)
    if unable is not None or row is None or row.provider_refund_id is None:
        if unable is not None and reversible:  # a re-read of a settled refund has nothing to report
            await _note(event, None if row is None else refund_id, *unable)
        return {"refund_id": refund_id, "status": "settled"}  # by the other path, first; or still paying
    payment = await call(fetch_refund_step, row.provider_refund_id, row.idempotency_key or "")
    outcome, reason = judge(row, payment, reversible=reversible)
    if outcome == "accepted":
        return await (reverse(row, payment, event) if row.status == "completed" else settle(row, payment, event=event))
    if next_check is not None:  # a re-read waits for the next one (one refused is recorded, logged and counted)
        await _schedule_check(refund_id, next_check)
        if outcome == "rejected":
            await _note(event, refund_id, outcome, reason)
        return {"refund_id": refund_id, "status": Phase.SETTLING.value, "provider_status": payment.status}
    if outcome == "ignored" and event.status not in (None, payment.status):
        reason = "provider_disagrees"  # e.g. a refund.failed for a refund the provider (re-read) says it paid
    await _note(event, refund_id, outcome, reason)
    return {"refund_id": refund_id, "status": "unchanged", "reason": reason, "provider_status": payment.status}


@DBOS.workflow(name=PAYMENT_CHECK_WORKFLOW)
async def payment_check_workflow(refund_id: str, n: int) -> dict[str, Any]:
    """Due every ``PAYMENT_RECHECK_SECONDS`` while the provider has not settled: read again, settle or wait."""
    return await _read_and_settle(refund_id, ProviderEvent(key=check_id(refund_id, n), source="recheck"), n + 1)


@DBOS.workflow(name=PAYMENT_EVENT_WORKFLOW)
async def payment_event_workflow(
    refund_id: str, provider_refund_id: str, event: dict[str, str] | None = None
) -> dict[str, Any]:
    """Enqueued by a verified webhook whose event matched the row: read the refund the row holds from the
    provider (not the one the event names) and settle, reverse or change nothing. ``event``: the event's id,
    type and claimed status (absent from events a release before them enqueued)."""
    facts = event or {}
    note = ProviderEvent(
        key=facts.get("id") or str(DBOS.workflow_id),
        source="webhook",
        event_type=safe_event_type(facts.get("type")),
        provider_refund_id=safe_id(provider_refund_id),
        status=facts.get("status") or None,
    )
    return await _read_and_settle(refund_id, note, None)
