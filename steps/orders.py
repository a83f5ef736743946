"""Reads of the order store: each is one DBOS step inside a workflow (checkpointed in the system database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from steps.records import Order, OrderSnapshot, PastRefund, from_minor
from steps.store import customers, orders, read_step, refunds, utc


def order_from_row(row: Any) -> Order:
    return Order(
        order_id=row.order_id,
        customer_id=row.customer_id,
        customer_name=row.name,
        currency=row.currency,
        amount_captured=from_minor(row.amount_captured_minor, row.currency),
        amount_refunded=from_minor(row.amount_refunded_minor, row.currency),
        status=row.status,
        paid_at=utc(row.paid_at) if row.paid_at else None,
        charge_id=row.charge_id,
        items=list(row.items),
        notes=row.notes,
    )


ORDER_QUERY = sa.select(orders, customers.c.name).join(customers)


@read_step("orders.load_order")
def load_order_step(conn: sa.Connection, order_id: str) -> OrderSnapshot | None:
    """The order as it is now, stamped with the time it was read."""
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    if row is None:
        return None
    return OrderSnapshot(order=order_from_row(row), as_of=datetime.now(UTC))


@read_step("orders.refund_history")
def refund_history_step(conn: sa.Connection, customer_id: str) -> list[PastRefund]:
    """The customer's earlier refund requests across all their orders, newest first."""
    rows = conn.execute(
        sa.select(refunds)
        .join(orders, orders.c.order_id == refunds.c.order_id)
        .where(orders.c.customer_id == customer_id)
        .order_by(refunds.c.created_at.desc())
        .limit(20)
    )
    return [
        PastRefund(
            refund_id=row.refund_id,
            order_id=row.order_id,
            amount=from_minor(row.proposed_amount_minor or row.requested_amount_minor or 0, row.currency),
            currency=row.currency,
            status=row.status,
            created_at=utc(row.created_at),
        )
        for row in rows
    ]


def list_orders(conn: sa.Connection, *, limit: int, after: str | None = None) -> list[Order]:
    query = ORDER_QUERY.order_by(orders.c.order_id).limit(limit)
    if after is not None:
        query = query.where(orders.c.order_id > after)
    return [order_from_row(row) for row in conn.execute(query)]


def get_order(conn: sa.Connection, order_id: str) -> Order | None:
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    return order_from_row(row) if row else None
