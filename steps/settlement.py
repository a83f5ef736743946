"""A refund the provider has not settled yet: parked as rows, settled once by whoever learns the outcome first.

The refund's row moves ``paying`` -> ``settling`` (the provider said pending or requires_action) ->
``completed`` (succeeded) or ``failed`` (failed, canceled), each move in a transaction that checks the
row's status first, so the deciding workflow, a scheduled re-read and a webhook can race and one wins.
A paid refund the provider fails later (Stripe allows ``succeeded`` -> ``failed``) moves ``completed`` ->
``failed`` once, giving the order its amount back.

A provider's word changes a row only when the provider refund it names is the one the row holds: same id,
the row's metadata base key, amount, currency and charge (``judge``). What changes the row is always
re-read from the provider, and judged again under the row's lock right before it is booked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps import audit
from steps.notify import CustomerMessage, queue_customer_message, queue_operator_alert
from steps.payments import idempotency_key
from steps.provider_events import Outcome, ProviderEvent, record_event
from steps.records import ProviderRefund, Record, from_minor, to_minor
from steps.store import audit_log, orders, read_step, refunds, session, transaction

#: Row statuses a provider's final answer may still settle.
UNSETTLED = ("paying", "settling")
#: Statuses after which the provider never changes its mind about a refund (but ``succeeded`` -> ``failed``).
FINAL = ("succeeded", "failed", "canceled")


class SettlingPayment(Record):
    """A refund's row as settling it needs to know it (and what was booked, once it completed)."""

    refund_id: str
    order_id: str
    customer_id: str
    status: str
    provider_refund_id: str | None
    idempotency_key: str | None
    amount: Decimal | None
    """What the provider refund must be for: the reservation while paying or settling, what was booked once
    completed (its ``refund_paid`` audit entry: the row keeps no amount after completion)."""
    currency: str
    charge_id: str | None = None
    """The order's charge: the provider refund must refund it."""


def _view(conn: sa.Connection | Session, refund_id: str, *, lock: bool = False) -> SettlingPayment | None:
    query = (
        sa.select(refunds, orders.c.customer_id, orders.c.charge_id)
        .outerjoin(orders, orders.c.order_id == refunds.c.order_id)
        .where(refunds.c.refund_id == refund_id)
    )
    dialect = conn.dialect if isinstance(conn, sa.Connection) else conn.get_bind().dialect
    if lock and dialect.name == "postgresql":
        query = query.with_for_update(of=refunds)
    row = conn.execute(query).one_or_none()
    if row is None:
        return None
    amount = None if row.reserved_amount_minor is None else from_minor(int(row.reserved_amount_minor), row.currency)
    if row.status == "completed":
        amount = _booked(conn, refund_id, row.provider_refund_id, row.currency)
    return SettlingPayment(
        refund_id=refund_id,
        order_id=row.order_id,
        customer_id=row.customer_id or "",
        status=row.status,
        provider_refund_id=row.provider_refund_id,
        idempotency_key=row.idempotency_key,
        amount=amount,
        currency=row.currency,
        charge_id=row.charge_id,
    )


def _booked(
    conn: sa.Connection | Session, refund_id: str, provider_refund_id: str | None, currency: str
) -> Decimal | None:
    """The amount booked against the order for ``provider_refund_id``, from the refund's ``refund_paid`` entry."""
    return amounts_paid(conn, {refund_id: (provider_refund_id, currency)}).get(refund_id)


def amounts_paid(conn: sa.Connection | Session, held: Mapping[str, tuple[str | None, str]]) -> dict[str, Decimal]:
    """What each refund paid: ``held`` maps a completed refund's id to the provider refund and currency its row
    holds; the answer has the amount of its last ``refund_paid`` entry when that entry is for them (the row keeps
    no amount once paid). A refund missing from the answer paid nothing: never a 0."""
    if not held:
        return {}
    query = (
        sa.select(audit_log.c.refund_id, audit_log.c.payload)
        .where(audit_log.c.refund_id.in_(list(held)), audit_log.c.event == "refund_paid")
        .order_by(audit_log.c.seq)
    )
    last = {row.refund_id: json.loads(row.payload) for row in conn.execute(query)}  # the newest entry wins
    paid: dict[str, Decimal] = {}
    for refund_id, entry in last.items():
        if (entry.get("provider_refund_id"), entry.get("currency")) == held[refund_id]:
            paid[refund_id] = Decimal(str(entry["amount"]))
    return paid


def provider_view(conn: sa.Connection, refund_id: str) -> SettlingPayment | None:
    """The refund's row as a provider's event is judged against it; None when there is no such refund."""
    return _view(conn, refund_id)


def _content_mismatch(row: SettlingPayment, payment: ProviderRefund) -> str | None:
    if payment.metadata_key is None or payment.metadata_key != idempotency_key(row.refund_id, row.order_id):
        return "other_idempotency_key"
    if payment.charge is None or payment.charge != row.charge_id:
        return "other_charge"
    if row.amount is None or (payment.amount, payment.currency) != (row.amount, row.currency):
        return "other_amount"
    return None


def standing(row: SettlingPayment | None, *, reversible: bool) -> tuple[Outcome, str] | None:
    """Why no word from the provider can change ``row`` now; None when one may: the row is settling, or it is
    completed and ``reversible`` (a paid refund the provider may still fail). Either way it holds a provider refund."""
    if row is None:
        return "rejected", "unknown_refund"
    if row.status == "paying":  # its own workflow settles what it pays
        return "ignored", "still_paying"
    if row.status == "failed" or (row.status == "completed" and not reversible):
        return "ignored", "already_settled"
    if row.status not in ("settling", "completed"):
        return "rejected", "not_paid"
    if row.provider_refund_id is None:
        return "rejected", "no_provider_refund"
    return None


def judge(row: SettlingPayment | None, payment: ProviderRefund, *, reversible: bool) -> tuple[Outcome, str]:
    """What the provider's word on ``payment`` does to ``row``: ``accepted`` (settle it, or reverse a paid one
    when ``reversible``), ``ignored`` or ``rejected``, with the reason."""
    if row is not None and row.status == "paying" and (other := _content_mismatch(row, payment)) is not None:
        return "rejected", other  # not even about the payment being made
    if (found := standing(row, reversible=reversible)) is not None:
        return found
    assert row is not None
    if payment.provider_refund_id != row.provider_refund_id:
        return "rejected", "other_provider_refund"
    if (other := _content_mismatch(row, payment)) is not None:
        return "rejected", other
    if payment.status not in FINAL:
        return "ignored", "not_final"
    if row.status == "completed":
        return ("ignored", "already_settled") if payment.status == "succeeded" else ("accepted", "reversed")
    return "accepted", payment.status


@transaction("refunds.park_payment")
def park_payment_step(refund_id: str, payment: ProviderRefund) -> bool:
    """The provider has not settled the refund: keep its reservation and wait as rows. False if settled meanwhile."""
    row = _view(session(), refund_id, lock=True)
    if row is None or row.status != "paying":
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
    """The refund's row as settling (or reversing) it needs to know it; None when there is no such refund."""
    return _view(conn, refund_id)


def _own_payment(row: SettlingPayment | None, payment: ProviderRefund) -> tuple[Outcome, str]:
    """The paying workflow settles the payment its own step made: the row holds none yet, or that one."""
    if row is None or row.status not in UNSETTLED:
        return "ignored", "already_settled"
    if row.provider_refund_id not in (None, payment.provider_refund_id):
        return "rejected", "other_provider_refund"
    return "accepted", payment.status


@transaction("refunds.settle_payment")
def settle_payment_step(
    refund_id: str,
    payment: ProviderRefund,
    *,
    notify: CustomerMessage | None,
    alert: str | None,
    event: ProviderEvent | None = None,
) -> bool:
    """Book the provider's final answer once: succeeded is paid (and the customer told), failed or canceled
    releases the reservation and alerts operators. False, changing nothing, when it was settled already or
    (for a re-read or an event: ``event``) the provider refund is not the one the row holds."""
    row = _view(session(), refund_id, lock=True)
    outcome, reason = _own_payment(row, payment) if event is None else judge(row, payment, reversible=False)
    if event is not None:
        record_event(session(), event, refund_id=refund_id if row else None, outcome=outcome, reason=reason)
    if outcome != "accepted":
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


@transaction("refunds.reverse_payment")
def reverse_payment_step(refund_id: str, payment: ProviderRefund, *, alert: str, event: ProviderEvent) -> bool:
    """A paid refund the provider failed afterwards: record it failed, give the order back what was booked, and
    alert operators, once. False, changing nothing, unless the row is completed and holds this provider refund,
    booked for its amount, and the provider (re-read) says it failed or was canceled."""
    row = _view(session(), refund_id, lock=True)
    outcome, reason = judge(row, payment, reversible=True)
    record_event(session(), event, refund_id=refund_id if row else None, outcome=outcome, reason=reason)
    if (outcome, reason) != ("accepted", "reversed"):
        return False
    assert row is not None and row.amount is not None
    now = datetime.now(UTC)
    session().execute(
        orders.update()
        .where(orders.c.order_id == row.order_id)
        .values(amount_refunded_minor=orders.c.amount_refunded_minor - to_minor(row.amount, row.currency))
    )
    session().execute(
        refunds.update()
        .where(refunds.c.refund_id == refund_id)
        .values(
            status="failed",
            provider_status=payment.status,
            provider_failure_reason=payment.failure_reason,
            updated_at=now,
        )
    )
    detail = f"reversed after being paid: the provider's refund {payment.provider_refund_id} {payment.status}"
    if payment.failure_reason:
        detail += f": {payment.failure_reason}"
    payload = {
        "detail": detail,
        "released": {"amount": str(row.amount), "currency": row.currency},
        "provider": payment.model_dump(mode="json"),
    }
    audit.append(session(), refund_id=refund_id, event="refund_reversed", payload=payload, now=now)
    queue_operator_alert(refund_id, kind="payment_reversed", text=alert)
    return True
