"""Who is claiming, and what else they have open: the reads a case file and a reservation make about a claimant.

A claimant is more than a customer id. An order holds three identities of the person who placed it: the
customer's email (as one mailbox, ``records.email_key``), the shipping address (``records.address_key``) and
the paying card's fingerprint. Every customer id that shares one of them with the order is the same claimant
for the repeat-claimant rule. And one order has one open claim: a refund that has not ended holds the order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps.records import Order, PastRefund, address_key, email_key, from_minor
from steps.store import customers, orders, refunds, utc

#: How a refund ends; any other phase (received, deciding, awaiting_approval, paying, settling) holds its order.
ENDED = ("completed", "rejected", "failed", "cancelled")
#: Phases in which a refund is paying or has been paid at the provider without having ended.
MOVING_MONEY = ("paying", "settling")
#: Customer ids read per shared identity: an address many customers share (a parcel forwarder, an office) links
#: at most this many.
LINKED_LIMIT = 20
#: The claimant's most recently paid charges whose refunds at the provider are read.
CHARGES_LIMIT = 10


def linked_customers(conn: sa.Connection, order: Order) -> dict[str, str]:
    """The order's customer (``""``) and every other customer id sharing its email, address or card, with which
    identity linked it (the first found, in that order)."""
    found = {order.customer_id: ""}
    lookups = (
        ("email", customers.c.customer_id, customers.c.email_key == email_key(order.customer_email)),
        ("address", orders.c.customer_id, orders.c.address_key == address_key(order.shipping_address)),
        ("card", orders.c.customer_id, orders.c.card_fingerprint == order.card_fingerprint),
    )
    held = (email_key(order.customer_email), address_key(order.shipping_address), order.card_fingerprint)
    for (via, column, matches), key in zip(lookups, held, strict=True):
        if not key:  # an identity the order does not hold links nobody
            continue
        query = sa.select(column).where(matches).distinct().order_by(column).limit(LINKED_LIMIT)
        for customer_id in conn.execute(query).scalars():
            found.setdefault(customer_id, via)
    return found


def past_refund(row: Any, linked: dict[str, str] | None = None) -> PastRefund:
    """A refund row as the history and the open claims carry it."""
    return PastRefund(
        refund_id=row.refund_id,
        order_id=row.order_id,
        amount=from_minor(row.proposed_amount_minor or row.requested_amount_minor or 0, row.currency),
        currency=row.currency,
        status=row.status,
        created_at=utc(row.created_at),
        claim_category=row.claim_category or "",
        linked_by=(linked or {}).get(getattr(row, "customer_id", ""), ""),
    )


def open_claims(conn: sa.Connection, order_id: str) -> list[PastRefund]:
    """The order's refunds that have not ended, oldest first (the refund being decided among them)."""
    query = (
        sa.select(refunds)
        .where(refunds.c.order_id == order_id, refunds.c.status.not_in(ENDED))
        .order_by(refunds.c.created_at, refunds.c.refund_id)
    )
    return [past_refund(row) for row in conn.execute(query)]


def claimant_charges(conn: sa.Connection, customer_ids: Iterable[str]) -> dict[str, str]:
    """The claimant's most recently paid charges (charge id -> order id), across their linked customer ids."""
    query = (
        sa.select(orders.c.charge_id, orders.c.order_id)
        .where(orders.c.customer_id.in_(list(customer_ids)), orders.c.paid_at.is_not(None), orders.c.charge_id != "")
        .order_by(orders.c.paid_at.desc(), orders.c.order_id)
        .limit(CHARGES_LIMIT)
    )
    return {row.charge_id: row.order_id for row in conn.execute(query)}


def claim_ahead(sess: Session, refund_id: str, order_id: str, *, allowed: int = 1) -> str | None:
    """Another refund of the order that this one may not be paid beside, read under the order's lock: one that is
    moving money, or one claimed earlier that has not ended. None when this refund is the order's one claim.

    A later claim still deciding or waiting for a person does not hold back an earlier one (else two claims made
    at once would each wait for the other); it waits for a person itself. ``allowed``: claims open on one order at
    once (``ORDER_MAX_OPEN_CLAIMS``)."""
    mine = sess.execute(sa.select(refunds.c.created_at).where(refunds.c.refund_id == refund_id)).scalar_one()
    others = sess.execute(
        sa.select(refunds.c.refund_id, refunds.c.status, refunds.c.created_at, refunds.c.reserved_amount_minor)
        .where(refunds.c.order_id == order_id, refunds.c.refund_id != refund_id, refunds.c.status.not_in(ENDED))
        .order_by(refunds.c.created_at, refunds.c.refund_id)
    ).all()
    ahead = [
        other
        for other in others
        if (utc(other.created_at), other.refund_id) < (utc(mine), refund_id)
        or other.status in MOVING_MONEY
        or other.reserved_amount_minor is not None
    ]
    if len(ahead) < allowed:
        return None
    return f"refund {ahead[0].refund_id} of this order is still open ({ahead[0].status.replace('_', ' ')})"
