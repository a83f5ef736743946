"""A refund the provider has not settled yet: parked as rows, settled once by whoever learns the outcome first.

The refund's row moves ``paying`` -> ``settling`` (the provider said pending or requires_action) ->
``completed`` (succeeded) or ``failed`` (failed, canceled), each move in a transaction that checks the
row's status first, so the deciding workflow, a scheduled re-read and a webhook can race and one wins.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import sqlalchemy as sa

from steps import audit
from steps.notify import CustomerMessage, queue_customer_message, queue_operator_alert
from steps.records import ProviderRefund, Record, from_minor, to_minor
from steps.store import orders, read_step, refunds, session, transaction

#: Row statuses a provider's final answer may still settle.
UNSETTLED = ("paying", "settling")


class SettlingPayment(Record):
    """What settling a refund needs to know, read from its row."""

    refund_id: str
    order_id: str
    customer_id: str
    status: str
    provider_refund_id: str | None
    idempotency_key: str | None
    amount: Decimal | None
    currency: str


def _locked_status(refund_id: str) -> str | None:
    query = sa.select(refunds.c.status).where(refunds.c.refund_id == refund_id)
    if session().get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    found = session().execute(query).scalar_one_or_none()
    return None if found is None else str(found)


@transaction("refunds.park_payment")
def park_payment_step(refund_id: str, payment: ProviderRefund) -> bool:
    """The provider has not settled the refund: keep its reservation and wait as rows. False if settled meanwhile."""
    if _locked_status(refund_id) != "paying":
        return False
    now = datetime.now(UTC)
    session().execute(
        refunds.update()
        .where(refunds.c.refund_id == refund_id)
        .values(
            status="settling",
            provider_refund_id=payment.provider_refund_id,
            idempotency_key=payment.idempotency_key,
            provider_status=payment.status,
            updated_at=now,
        )
    )
    audit.append(session(), refund_id=refund_id, event="refund_pending", payload=payment.model_dump(), now=now)
    return True


@read_step("refunds.settling_payment")
def settling_payment_step(conn: sa.Connection, refund_id: str) -> SettlingPayment | None:
    """The refund as settling needs it, or None when it is not waiting for the provider (any more)."""
    row = conn.execute(
        sa.select(refunds, orders.c.customer_id)
        .join(orders, orders.c.order_id == refunds.c.order_id)
        .where(refunds.c.refund_id == refund_id)
    ).one_or_none()
    if row is None or row.status not in UNSETTLED:
        return None
    reserved = row.reserved_amount_minor
    return SettlingPayment(
        refund_id=refund_id,
        order_id=row.order_id,
        customer_id=row.customer_id,
        status=row.status,
        provider_refund_id=row.provider_refund_id,
        idempotency_key=row.idempotency_key,
        amount=None if reserved is None else from_minor(int(reserved), row.currency),
        currency=row.currency,
    )


@transaction("refunds.settle_payment")
def settle_payment_step(
    refund_id: str, payment: ProviderRefund, *, notify: CustomerMessage | None, alert: str | None
) -> bool:
    """Book the provider's final answer once: succeeded is paid (and the customer told), failed or canceled
    releases the reservation and alerts operators. False, changing nothing, when it was settled already."""
    if _locked_status(refund_id) not in UNSETTLED:
        return False
    now = datetime.now(UTC)
    values = {
        "provider_refund_id": payment.provider_refund_id,
        "idempotency_key": payment.idempotency_key,
        "provider_status": payment.status,
        "provider_failure_reason": payment.failure_reason,
        "reserved_amount_minor": None,
        "updated_at": now,
    }
    if payment.status == "succeeded":
        order_id = session().execute(sa.select(refunds.c.order_id).where(refunds.c.refund_id == refund_id)).scalar_one()
        session().execute(
            orders.update()
            .where(orders.c.order_id == order_id)
            .values(amount_refunded_minor=orders.c.amount_refunded_minor + to_minor(payment.amount, payment.currency))
        )
        session().execute(refunds.update().where(refunds.c.refund_id == refund_id).values(status="completed", **values))
        audit.append(session(), refund_id=refund_id, event="refund_paid", payload=payment.model_dump(), now=now)
        if notify is not None:
            queue_customer_message(refund_id, notify)
        return True
    session().execute(refunds.update().where(refunds.c.refund_id == refund_id).values(status="failed", **values))
    detail = f"the provider's refund {payment.provider_refund_id} {payment.status}"
    if payment.failure_reason:
        detail += f": {payment.failure_reason}"
    payload = {"detail": detail, "provider": payment.model_dump(mode="json")}
    audit.append(session(), refund_id=refund_id, event="refund_failed", payload=payload, now=now)
    if alert is not None:
        queue_operator_alert(refund_id, kind="payment_failed", text=alert)
    return True
