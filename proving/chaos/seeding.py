"""What a chaos run writes before it starts: the shop's customers and orders, and the provider's charges.

Both come from the plan, so the service, the payment provider and the plan's expectations agree on every order.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from proving.chaos.plan import Plan
from steps.records import to_minor
from steps.store import customers, orders


def provider_charges(plan: Plan) -> list[dict[str, Any]]:
    """The plan's orders' charges as the payment provider holds them (for the sandbox's charge ledger)."""
    return [
        {
            "id": f"ch_{p.order_id}",
            "amount": to_minor(p.captured, p.currency),
            "currency": p.currency.lower(),
            "amount_refunded": to_minor(p.refunded, p.currency),
        }
        for p in plan.refunds
    ]


def insert_orders(engine: sa.Engine, plan: Plan, *, now: datetime | None = None) -> None:
    """Write the plan's customers and orders into the application database."""
    now = now or datetime.now(UTC)
    with engine.begin() as conn:
        for customer_id in sorted({p.customer_id for p in plan.refunds}):
            conn.execute(
                customers.insert().values(customer_id=customer_id, name=customer_id, email="chaos@example.com")
            )
        for p in plan.refunds:
            conn.execute(
                orders.insert().values(
                    order_id=p.order_id,
                    customer_id=p.customer_id,
                    currency=p.currency,
                    amount_captured_minor=to_minor(p.captured, p.currency),
                    amount_refunded_minor=to_minor(p.refunded, p.currency),
                    status=p.order_status,
                    paid_at=now - timedelta(days=p.days_since_payment),
                    charge_id=f"ch_{p.order_id}",
                    carrier=p.carrier,
                    tracking_code=p.tracking_code,
                    items=["Chaos item"],
                    notes="",
                )
            )
