"""Reads of the order store: each is one DBOS step inside a workflow (checkpointed in the system database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps.records import CaseFile, Order, OrderSnapshot, PastRefund, from_minor
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
        customer_email=row.email,
        carrier=row.carrier,
        tracking_code=row.tracking_code,
    )


ORDER_QUERY = sa.select(orders, customers.c.name, customers.c.email).join(customers)


@read_step("orders.load_order")
def load_order_step(conn: sa.Connection, order_id: str) -> OrderSnapshot | None:
    """The order as it is now, stamped with the time it was read."""
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    if row is None:
        return None
    return OrderSnapshot(order=order_from_row(row), as_of=datetime.now(UTC))


HISTORY_LIMIT = 20


def refund_history_query(customer_id: str, dialect: str, limit: int = HISTORY_LIMIT) -> sa.Select[Any]:
    """The customer's newest ``limit`` refunds, reading at most about ``limit`` rows of each of their orders.

    A refund belongs to one order, so the newest ``limit`` overall are among the newest ``limit`` of each
    order: a walk down ``ix_refunds_order_id_created_at`` per order. A join sorted as a whole instead
    reads every refund the customer ever asked for, on every new request. Postgres plans that join as a
    sort of all of them, so it gets the per-order walk spelled out as a LATERAL join; SQLite walks the
    index per order and stops each walk once ``limit`` newer rows are held, so the join is enough there.
    """
    if dialect != "postgresql":
        return (
            sa.select(refunds)
            .join(orders, orders.c.order_id == refunds.c.order_id)
            .where(orders.c.customer_id == customer_id)
            .order_by(refunds.c.created_at.desc())
            .limit(limit)
        )
    owned = sa.select(orders.c.order_id).where(orders.c.customer_id == customer_id).subquery("owned")
    newest = (
        sa.select(refunds)
        .where(refunds.c.order_id == owned.c.order_id)
        .order_by(refunds.c.created_at.desc())
        .limit(limit)
        .lateral("newest")
    )
    return (
        sa.select(newest).select_from(owned).join(newest, sa.true()).order_by(newest.c.created_at.desc()).limit(limit)
    )


def walk_indexes_in_order(conn: sa.Connection | Session) -> None:
    """Postgres, for the rest of this transaction: no bitmap scans, which return rows unordered.

    Without statistics on ``refunds`` (a young table, or autovacuum off) the planner guesses a couple
    of refunds per order and reads all of each order's refunds through a bitmap scan to sort them,
    the very cost the per-order walk avoids. Without bitmap scans the ordered walk is the cheapest plan.
    """
    dialect = conn.dialect if isinstance(conn, sa.Connection) else conn.get_bind().dialect
    if dialect.name == "postgresql":
        conn.execute(sa.text("SET LOCAL enable_bitmapscan = off"))


@read_step("orders.refund_history")
def refund_history_step(conn: sa.Connection, customer_id: str) -> list[PastRefund]:
    """The customer's earlier refund requests across all their orders, newest first."""
    return _history(conn, customer_id)


@read_step("orders.review_case")
def review_case_step(conn: sa.Connection, order_id: str) -> CaseFile:
    """Everything the agent judges a refund on, in one read: the order as it is now and the customer's refunds."""
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    if row is None:
        return CaseFile(snapshot=None)
    snapshot = OrderSnapshot(order=order_from_row(row), as_of=datetime.now(UTC))
    return CaseFile(snapshot=snapshot, history=_history(conn, snapshot.order.customer_id))


def _history(conn: sa.Connection, customer_id: str) -> list[PastRefund]:
    walk_indexes_in_order(conn)
    rows = conn.execute(refund_history_query(customer_id, conn.dialect.name))
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
