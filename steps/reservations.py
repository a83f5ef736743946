"""Paying a refund's part of the book: its amount reserved against the order under the order's lock right before
paying (auto-approved with its verdict, or once approved), and the provider's refund booked against the order."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from steps import audit
from steps.claimants import claim_ahead
from steps.notify import CustomerMessage, queue_customer_message
from steps.orders import ORDER_QUERY, order_from_row
from steps.records import ModelUsage, OrderSnapshot, ProviderRefund, from_minor, to_minor
from steps.refunds import PaymentPlan, record_verdict, touch
from steps.store import approval_requests, orders, refunds, session, transaction, utc


@transaction("refunds.prepare_approved_payment")
def prepare_approved_payment_step(refund_id: str, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve an approved refund's amount against its order right before paying; stamp the first attempt
    (kept across retries). The order comes from the refund's row; the amount is the one approved, which is
    more than 0 and at most what its approval request asked for, in the request's currency (an approver may
    approve less, never more).

    The snapshot counts what other refunds of the order are paying right now as already refunded, so
    two refunds of one order on two workers cannot both pass the balance check. The order's row is
    locked on Postgres; SQLite's IMMEDIATE transactions serialize writers anyway.
    """
    found = (
        session()
        .execute(
            sa.select(refunds.c.order_id, approval_requests.c.amount_minor, approval_requests.c.currency)
            .join(approval_requests, approval_requests.c.refund_id == refunds.c.refund_id)
            .where(refunds.c.refund_id == refund_id)
        )
        .first()
    )
    if found is None:
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal="no approval request")
    if currency != found.currency or not 0 < amount <= from_minor(found.amount_minor, found.currency):
        asked = f"{from_minor(found.amount_minor, found.currency)} {found.currency}"
        refusal = f"the approval is for {amount} {currency} but the request was for at most {asked}"
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal=refusal)
    order_id = str(found.order_id)
    return _reserve(refund_id, order_id, _locked_order(order_id), amount=amount, currency=currency)


@transaction("refunds.record_verdict_and_reserve")
def record_verdict_and_reserve_step(
    refund_id: str,
    order_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None = None,
    amount: Decimal,
    currency: str,
    evidence: dict[str, Any] | None = None,
    open_claims_allowed: int = 1,
) -> PaymentPlan:
    """An auto-approved refund has nothing to wait for: its verdict and its reservation commit together.

    The order's row is locked first, before the verdict's audit entries take the audit chain's lock:
    ``record_payment`` takes the two in that order, and the reverse order deadlocks against it.
    """
    order = _locked_order(order_id)
    record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    # One open claim per order: the case file sent a second claim to a person, but two claims decided at once can
    # each have been read before the other; under the order's lock, the later one is refused, nothing reserved.
    if (ahead := claim_ahead(session(), refund_id, order_id, allowed=open_claims_allowed)) is not None:
        refusal = f"{ahead}: a second claim on one order is never paid on its own"
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal=refusal)
    return _reserve(refund_id, order_id, order, amount=amount, currency=currency)


def _locked_order(order_id: str) -> Any:
    """The order's row, locked until the transaction ends (Postgres; SQLite serializes writers anyway)."""
    return session().execute(ORDER_QUERY.where(orders.c.order_id == order_id).with_for_update(of=orders)).first()


def _reserve(refund_id: str, order_id: str, row: Any, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve ``amount`` on the refund's row against ``row``, the order as read under its lock; the plan carries
    the amount the refund's request asked for, read in the same transaction, for the re-check before paying."""
    now = datetime.now(UTC)
    mine = (
        session()
        .execute(
            sa.select(refunds.c.payment_started_at, refunds.c.requested_amount_minor, refunds.c.currency).where(
                refunds.c.refund_id == refund_id
            )
        )
        .one()
    )
    first = utc(mine.payment_started_at) if mine.payment_started_at else now
    asked = mine.requested_amount_minor
    requested = None if asked is None else from_minor(asked, mine.currency)
    in_flight = (
        session()
        .execute(
            sa.select(sa.func.coalesce(sa.func.sum(refunds.c.reserved_amount_minor), 0)).where(
                refunds.c.order_id == order_id,
                refunds.c.refund_id != refund_id,
                refunds.c.reserved_amount_minor.is_not(None),
            )
        )
        .scalar_one()
    )
    touch(refund_id, now, status="paying", payment_started_at=first, reserved_amount_minor=to_minor(amount, currency))
    snapshot = None
    if row is not None:
        order = order_from_row(row)
        held = from_minor(int(in_flight), order.currency)
        snapshot = OrderSnapshot(
            order=order.model_copy(update={"amount_refunded": order.amount_refunded + held}), as_of=now
        )
    return PaymentPlan(snapshot=snapshot, first_attempt_at=first, requested=requested)


@transaction("refunds.record_payment")
def record_payment_step(
    refund_id: str, order_id: str, payment: ProviderRefund, *, notify: CustomerMessage | None = None
) -> None:
    """Book the provider's refund against the order (once per provider refund id); queue ``notify`` with it."""
    now = datetime.now(UTC)
    minor = to_minor(payment.amount, payment.currency)
    recorded = (
        session()
        .execute(sa.select(refunds.c.provider_refund_id).where(refunds.c.refund_id == refund_id))
        .scalar_one_or_none()
    )
    if recorded != payment.provider_refund_id:  # a fork re-running this step gets the same provider refund back
        session().execute(
            orders.update()
            .where(orders.c.order_id == order_id)
            .values(amount_refunded_minor=orders.c.amount_refunded_minor + minor)
        )
    touch(
        refund_id,
        now,
        status="completed",
        reserved_amount_minor=None,
        provider_refund_id=payment.provider_refund_id,
        idempotency_key=payment.idempotency_key,
    )
    audit.append(session(), refund_id=refund_id, event="refund_paid", payload=payment.model_dump(), now=now)
    if notify is not None:
        queue_customer_message(refund_id, notify)
