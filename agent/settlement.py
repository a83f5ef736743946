"""Refunds the provider settles later: parked as rows until a webhook or a scheduled re-read says how it ended.

A Stripe refund can stay ``pending`` (or ``requires_action``) for days and then succeed or fail. Such a
refund parks the way approvals do: its row says ``settling`` and keeps the reservation, and a DELAYED
check workflow (``<key>/payment-check-<n>``, version-less, on the approvals queue) re-reads it when due.
A verified ``refund.updated`` / ``refund.failed`` webhook enqueues ``<key>/payment-<status>`` at once.
Whichever reads a final status first settles the row (steps/settlement.py); the others find it settled.
"""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS, EnqueueOptions

from agent.approval_workflows import enqueue_timer
from agent.approvals import APPROVAL_QUEUE
from agent.context import current
from agent.domain import Phase, paid_reply
from agent.ops.offloop import call
from steps.faults import crash_point
from steps.notify import CustomerMessage, slack_enabled, slack_operators_step
from steps.payments import fetch_refund_step
from steps.records import ProviderRefund
from steps.settlement import SettlingPayment, park_payment_step, settle_payment_step, settling_payment_step

log = logging.getLogger(__name__)

# Durable names: recorded with every workflow; never rename them.
PAYMENT_CHECK_WORKFLOW = "payment_check_workflow"
PAYMENT_EVENT_WORKFLOW = "payment_event_workflow"
#: Statuses after which the provider never changes its mind about a refund.
FINAL = ("succeeded", "failed", "canceled")


def settlement_prefix(refund_id: str) -> str:
    """Every settlement workflow of a refund starts with this ('/' never appears in a refund id)."""
    return f"{refund_id}/payment-"


def check_id(refund_id: str, n: int) -> str:
    return f"{settlement_prefix(refund_id)}check-{n}"


def event_id(refund_id: str, status: str) -> str:
    return f"{settlement_prefix(refund_id)}{status}"


def event_options(refund_id: str, status: str) -> EnqueueOptions:
    """How the webhook enqueues a settlement: version-less, deduplicated by refund and final status."""
    return {
        "queue_name": APPROVAL_QUEUE,
        "workflow_name": PAYMENT_EVENT_WORKFLOW,
        "workflow_id": event_id(refund_id, status),
    }


async def _schedule_check(refund_id: str, n: int) -> None:
    delay = current().settings.payment_recheck_seconds
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


async def settle(settling: SettlingPayment, payment: ProviderRefund) -> dict[str, Any]:
    """Book the provider's final answer once: paid and the customer told, or failed and operators alerted."""
    refund_id = settling.refund_id
    succeeded = payment.status == "succeeded"
    notify = CustomerMessage(settling.customer_id, paid_reply(payment.amount, payment.currency)) if succeeded else None
    alert = None
    if not succeeded:
        reason = f" ({payment.failure_reason})" if payment.failure_reason else ""
        alert = (
            f"Refund {refund_id}: the provider's refund {payment.provider_refund_id} {payment.status}{reason}. "
            f"Nothing was sent to the customer; the order's {payment.amount} {payment.currency} is refundable again."
        )
    changed = await call(settle_payment_step, refund_id, payment, notify=notify, alert=alert)
    crash_point("after_payment_settled")
    if changed and not succeeded:
        log.error("refund %s: provider refund %s %s", refund_id, payment.provider_refund_id, payment.status)
        if alert is not None and slack_enabled():
            await call(slack_operators_step, refund_id, text=alert)
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
        "settled_here": changed,
    }


async def _read_and_settle(refund_id: str, provider_refund_id: str | None, next_check: int | None) -> dict[str, Any]:
    settling = await call(settling_payment_step, refund_id)
    if settling is None:
        return {"refund_id": refund_id, "status": "settled"}  # by the other path, first
    found = settling.provider_refund_id or provider_refund_id
    if found is None:
        return {"refund_id": refund_id, "status": "settled"}  # still paying: its own workflow settles it
    payment = await call(fetch_refund_step, found, settling.idempotency_key or "")
    if payment.status not in FINAL:
        if next_check is not None:
            await _schedule_check(refund_id, next_check)
        return {"refund_id": refund_id, "status": Phase.SETTLING.value, "provider_status": payment.status}
    return await settle(settling, payment)


@DBOS.workflow(name=PAYMENT_CHECK_WORKFLOW)
async def payment_check_workflow(refund_id: str, n: int) -> dict[str, Any]:
    """Due every ``PAYMENT_RECHECK_SECONDS`` while the provider has not settled: read again, settle or wait."""
    return await _read_and_settle(refund_id, None, n + 1)


@DBOS.workflow(name=PAYMENT_EVENT_WORKFLOW)
async def payment_event_workflow(refund_id: str, provider_refund_id: str) -> dict[str, Any]:
    """Enqueued by a verified webhook: read the refund from the provider (not the event) and settle."""
    return await _read_and_settle(refund_id, provider_refund_id, None)
