"""The application's own book of refund requests; every write also appends to the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from steps import audit
from steps.notify import CustomerMessage, queue_customer_message
from steps.orders import ORDER_QUERY, order_from_row
from steps.records import ApprovalRecord, OrderSnapshot, ProviderRefund, from_minor, to_minor
from steps.store import app_db, approval_decisions, insert_if_absent, orders, refunds, session, transaction, utc


class RegisteredRequest(BaseModel):
    model_config = ConfigDict(frozen=True)
    refund_id: str
    request_hash: str
    created: bool


class ApprovalWindow(BaseModel):
    model_config = ConfigDict(frozen=True)
    requested_at: datetime
    escalate_at: datetime
    expires_at: datetime


class PaymentPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    snapshot: OrderSnapshot | None
    first_attempt_at: datetime


def register_request(
    *, refund_id: str, order_id: str, request_hash: str, currency: str, requested: Decimal | None
) -> RegisteredRequest:
    """Claim a request key before its workflow starts; a key already taken returns the first claim."""
    try:
        return _register(refund_id, order_id, request_hash, currency, requested)
    except sa.exc.IntegrityError:  # a concurrent request with the same key inserted first: read its claim
        return _register(refund_id, order_id, request_hash, currency, requested)


def _register(
    refund_id: str, order_id: str, request_hash: str, currency: str, requested: Decimal | None
) -> RegisteredRequest:
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        existing = conn.execute(
            sa.select(refunds.c.request_hash).where(refunds.c.refund_id == refund_id)
        ).scalar_one_or_none()
        if existing is not None:
            return RegisteredRequest(refund_id=refund_id, request_hash=existing, created=False)
        conn.execute(
            refunds.insert().values(
                refund_id=refund_id,
                order_id=order_id,
                request_hash=request_hash,
                currency=currency,
                requested_amount_minor=None if requested is None else to_minor(requested, currency),
                status="received",
                created_at=now,
                updated_at=now,
            )
        )
        audit.append(
            conn,
            refund_id=refund_id,
            event="request_received",
            payload={"order_id": order_id, "requested": str(requested) if requested else None},
            now=now,
        )
    return RegisteredRequest(refund_id=refund_id, request_hash=request_hash, created=True)


def _touch(refund_id: str, now: datetime, **values: Any) -> None:
    session().execute(refunds.update().where(refunds.c.refund_id == refund_id).values(updated_at=now, **values))


def _record_verdict(refund_id: str, proposal: dict[str, Any], verdict: dict[str, Any], model: str) -> None:
    now = datetime.now(UTC)
    currency = str(proposal["currency"])
    amount = Decimal(str(proposal["amount"]))
    _touch(
        refund_id,
        now,
        proposed_amount_minor=to_minor(amount, currency) if currency == verdict["currency"] else None,
        verdict=verdict["kind"],
        reason=str(proposal["reason"]),
        customer_reply=str(proposal["customer_reply"]),
        model=model,
        status="deciding",
    )
    audit.append(session(), refund_id=refund_id, event="agent_proposed", payload={**proposal, "model": model}, now=now)
    audit.append(session(), refund_id=refund_id, event="policy_verdict", payload=verdict, now=now)


@transaction("refunds.record_verdict")
def record_verdict_step(refund_id: str, *, proposal: dict[str, Any], verdict: dict[str, Any], model: str) -> None:
    _record_verdict(refund_id, proposal, verdict, model)


@transaction("refunds.open_approval")
def open_approval_step(refund_id: str, *, escalate_after: float, timeout: float) -> ApprovalWindow:
    now = datetime.now(UTC)
    window = ApprovalWindow(
        requested_at=now,
        escalate_at=now + timedelta(seconds=escalate_after),
        expires_at=now + timedelta(seconds=timeout),
    )
    _touch(refund_id, now, status="awaiting_approval")
    audit.append(session(), refund_id=refund_id, event="approval_requested", payload=window.model_dump(), now=now)
    return window


def _approval_from_row(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        refund_id=row.refund_id,
        decision=row.decision,
        approver=row.approver,
        amount=from_minor(row.amount_minor, row.currency),
        currency=row.currency,
        decided_at=utc(row.decided_at),
        note=row.note,
    )


def recorded_decision(conn: sa.Connection | Any, refund_id: str) -> ApprovalRecord | None:
    row = conn.execute(sa.select(approval_decisions).where(approval_decisions.c.refund_id == refund_id)).first()
    return _approval_from_row(row) if row else None


def _claim_decision(conn: Any, record: ApprovalRecord) -> tuple[ApprovalRecord, bool]:
    """Insert the decision unless one exists; return the recorded one and whether it is ours."""
    values = {
        "refund_id": record.refund_id,
        "decision": record.decision,
        "approver": record.approver,
        "amount_minor": to_minor(record.amount, record.currency),
        "currency": record.currency,
        "decided_at": record.decided_at,
        "note": record.note,
    }
    if not insert_if_absent(conn, approval_decisions, values):
        existing = recorded_decision(conn, record.refund_id)
        assert existing is not None
        return existing, False
    audit.append(
        conn,
        refund_id=record.refund_id,
        event="approval_decided",
        payload=record.model_dump(),
        now=record.decided_at,
    )
    return record, True


def record_decision(record: ApprovalRecord) -> tuple[ApprovalRecord, bool]:
    """First writer wins: concurrent callers serialize on the primary key and all see one decision."""
    for _ in range(5):
        try:
            with app_db().engine.begin() as conn:
                return _claim_decision(conn, record)
        except sa.exc.IntegrityError:
            continue  # lost the race to a concurrent writer: read its decision
    raise RuntimeError(f"could not record a decision for {record.refund_id}")


@transaction("refunds.settle_approval")
def settle_approval_step(refund_id: str, *, amount: Decimal, currency: str) -> ApprovalRecord:
    """The decision that stands: a person's if one was recorded, else an expiry recorded now."""
    now = datetime.now(UTC)
    expired = ApprovalRecord(
        refund_id=refund_id,
        decision="expired",
        approver="system",
        amount=amount,
        currency=currency,
        decided_at=now,
        note="no decision before the approval deadline",
    )
    record, _ = _claim_decision(session(), expired)
    return record


@transaction("refunds.prepare_payment")
def prepare_payment_step(refund_id: str, order_id: str, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve the amount against the order right before paying; stamp the first attempt (kept across retries).

    The snapshot counts what other refunds of the order are paying right now as already refunded, so
    two refunds of one order on two workers cannot both pass the balance check. The order's row is
    locked on Postgres; SQLite's IMMEDIATE transactions serialize writers anyway.
    """
    return _reserve(refund_id, order_id, _locked_order(order_id), amount=amount, currency=currency)


@transaction("refunds.record_verdict_and_reserve")
def record_verdict_and_reserve_step(
    refund_id: str,
    order_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    amount: Decimal,
    currency: str,
) -> PaymentPlan:
    """An auto-approved refund has nothing to wait for: its verdict and its reservation commit together.

    The order's row is locked first, before the verdict's audit entries take the audit chain's lock:
    ``record_payment`` takes the two in that order, and the reverse order deadlocks against it.
    """
    order = _locked_order(order_id)
    _record_verdict(refund_id, proposal, verdict, model)
    return _reserve(refund_id, order_id, order, amount=amount, currency=currency)


def _locked_order(order_id: str) -> Any:
    """The order's row, locked until the transaction ends (Postgres; SQLite serializes writers anyway)."""
    return session().execute(ORDER_QUERY.where(orders.c.order_id == order_id).with_for_update(of=orders)).first()


def _reserve(refund_id: str, order_id: str, row: Any, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve ``amount`` on the refund's row against ``row``, the order as read under its lock."""
    now = datetime.now(UTC)
    started = (
        session().execute(sa.select(refunds.c.payment_started_at).where(refunds.c.refund_id == refund_id)).scalar_one()
    )
    first = utc(started) if started else now
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
    _touch(refund_id, now, status="paying", payment_started_at=first, reserved_amount_minor=to_minor(amount, currency))
    snapshot = None
    if row is not None:
        order = order_from_row(row)
        held = from_minor(int(in_flight), order.currency)
        snapshot = OrderSnapshot(
            order=order.model_copy(update={"amount_refunded": order.amount_refunded + held}), as_of=now
        )
    return PaymentPlan(snapshot=snapshot, first_attempt_at=first)


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
    _touch(
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


@transaction("refunds.record_outcome")
def record_outcome_step(
    refund_id: str,
    *,
    status: Literal["rejected", "failed", "cancelled"],
    detail: str,
    notify: CustomerMessage | None = None,
) -> None:
    """Record how the refund ended without paying; queue ``notify`` with it."""
    now = datetime.now(UTC)
    _touch(refund_id, now, status=status, reserved_amount_minor=None)  # whatever was held is released
    audit.append(session(), refund_id=refund_id, event=f"refund_{status}", payload={"detail": detail}, now=now)
    if notify is not None:
        queue_customer_message(refund_id, notify)
