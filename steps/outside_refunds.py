"""Refunds the payment provider made that this service did not: a refund from the provider's dashboard, or from
another system holding the same account. They count for the repeat-claimant rule like our own."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from dbos import DBOS

from steps.payments import PROVIDER_RETRIES, charge_refunds
from steps.records import PastRefund, from_minor

OUTSIDE_REFUNDS_STEP = "payments.outside_refunds"
#: A provider refund's status in the words of a refund's phase (the history's): failed and canceled ones paid nothing.
_PHASE = {
    "succeeded": "completed",
    "pending": "settling",
    "requires_action": "settling",
    "failed": "failed",
    "canceled": "cancelled",
}


@DBOS.step(name=OUTSIDE_REFUNDS_STEP, **PROVIDER_RETRIES)
def outside_refunds_step(charges: dict[str, str]) -> list[PastRefund]:
    """The refunds on these charges (charge id -> order id) that carry no key of ours in their metadata, newest
    first. Every refund this service makes names itself and its base key there (steps/payments.py), so any other is
    outside."""
    found: list[PastRefund] = []
    for charge_id, order_id in charges.items():
        for refund in charge_refunds(charge_id):
            metadata = cast(dict[str, str], refund.metadata.to_dict() if refund.metadata else {})
            if metadata.get("refund_id") or str(metadata.get("idempotency_key", "")).startswith("refund:"):
                continue  # ours: our own history counts it
            currency = str(refund.currency).upper()
            found.append(
                PastRefund(
                    refund_id=refund.id,
                    order_id=order_id,
                    amount=from_minor(int(refund.amount), currency),
                    currency=currency,
                    status=_PHASE.get(str(refund.status), str(refund.status)),
                    created_at=datetime.fromtimestamp(int(refund.created), UTC),
                    outside=True,
                )
            )
    return sorted(found, key=lambda r: r.created_at, reverse=True)
