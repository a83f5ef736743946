"""Reads of the order store: each is one DBOS step inside a workflow (checkpointed in the system database)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps.claimants import claimant_charges, linked_customers, open_claims, past_refund
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
        shipping_address=row.shipping_address,
        card_fingerprint=row.card_fingerprint,
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


def refund_history_query(customer_id: str | Sequence[str], dialect: str, limit: int = HISTORY_LIMIT) -> sa.Select[Any]:
    """The customer's (or customers') newest ``limit`` refunds, reading at most about ``limit`` rows of each of
    their orders; each row names the customer id of its order.

    A refund belongs to one order, so the newest ``limit`` overall are among the newest ``limit`` of each
    order: a walk down ``ix_refunds_order_id_created_at`` per order. A join sorted as a whole instead
    reads every refund the customer ever asked for, on every new request. Postgres plans that join as a
    sort of all of them, so it gets the per-order walk spelled out as a LATERAL join; SQLite walks the
    index per order and stops each walk once ``limit`` newer rows are held, so the join is enough there.
    """
    ids = [customer_id] if isinstance(customer_id, str) else list(customer_id)
    if dialect != "postgresql":
        return (
            sa.select(refunds, orders.c.customer_id)
            .join(orders, orders.c.order_id == refunds.c.order_id)
            .where(orders.c.customer_id.in_(ids))
            .order_by(refunds.c.created_at.desc())
            .limit(limit)
        )
    owned = sa.select(orders.c.order_id, orders.c.customer_id).where(orders.c.customer_id.in_(ids)).subquery("owned")
    newest = (
        sa.select(refunds)
        .where(refunds.c.order_id == owned.c.order_id)
        .order_by(refunds.c.created_at.desc())
        .limit(limit)
        .lateral("newest")
    )
    return (
        sa.select(newest, owned.c.customer_id)
        .select_from(owned)
        .join(newest, sa.true())
        .order_by(newest.c.created_at.desc())
        .limit(limit)
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
    """Everything the agent judges a refund on, in one read: the order as it is now, the claimant's refunds across
    every customer id sharing the order's email, address or card, the order's open claims, and the claimant's
    charges (where the payment provider is asked about refunds made outside this service)."""
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    if row is None:
        return CaseFile(snapshot=None)
    snapshot = OrderSnapshot(order=order_from_row(row), as_of=datetime.now(UTC))
    linked = linked_customers(conn, snapshot.order)
    return CaseFile(
        snapshot=snapshot,
        history=_history(conn, linked),
        open_claims=open_claims(conn, order_id),
        charges=claimant_charges(conn, linked),
    )


def _history(conn: sa.Connection, linked: str | dict[str, str]) -> list[PastRefund]:
    """Newest first; ``linked`` maps customer ids to how they are linked to the order's customer (``""``: theirs)."""
    linked = {linked: ""} if isinstance(linked, str) else linked
    walk_indexes_in_order(conn)
    return [past_refund(row, linked) for row in conn.execute(refund_history_query(list(linked), conn.dialect.name))]


def list_orders(conn: sa.Connection, *, limit: int, after: str | None = None) -> list[Order]:
    query = ORDER_QUERY.order_by(orders.c.order_id).limit(limit)
    if after is not None:
        query = query.where(orders.c.order_id > after)
    return [order_from_row(row) for row in conn.execute(query)]


def get_order(conn: sa.Connection, order_id: str) -> Order | None:
    row = conn.execute(ORDER_QUERY.where(orders.c.order_id == order_id)).first()
    return order_from_row(row) if row else None
