"""Money rules: pure functions of an order, an amount, a time and the limits. No I/O, no model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from agent.domain import Verdict
from steps.records import Order, quantize

ZERO = Decimal(0)


@dataclass(frozen=True)
class Limits:
    auto_approve: Decimal
    absolute_cap: Decimal
    window_days: int
    auto_approve_by_currency: Mapping[str, Decimal] = field(default_factory=dict)
    absolute_cap_by_currency: Mapping[str, Decimal] = field(default_factory=dict)

    def auto_approve_for(self, currency: str) -> Decimal:
        return self.auto_approve_by_currency.get(currency, self.auto_approve)

    def absolute_cap_for(self, currency: str) -> Decimal:
        return self.absolute_cap_by_currency.get(currency, self.absolute_cap)


def days_since_payment(paid_at: datetime, as_of: datetime) -> int:
    """Whole days elapsed since payment: 60 days and 23 hours after it is day 60."""
    return (as_of - paid_at).days


def within_window(days_since_payment: int, window_days: int) -> bool:
    """The refund window's one rule: an order is refundable through the whole of day ``window_days``."""
    return days_since_payment <= window_days


def _in_window(order: Order, as_of: datetime, window_days: int) -> bool:
    return order.paid_at is not None and within_window(days_since_payment(order.paid_at, as_of), window_days)


def refundable(order: Order, as_of: datetime, window_days: int) -> Decimal:
    """What may still be refunded on this order now: 0 unless paid, undisputed and inside the window."""
    if order.status != "paid" or not _in_window(order, as_of, window_days):
        return ZERO
    return max(order.remaining, ZERO)


def blockers(order: Order, as_of: datetime, window_days: int) -> list[str]:
    if order.status == "disputed":
        return ["the order is disputed; refunds go through the dispute"]
    if order.status != "paid" or order.paid_at is None:
        return ["the order is not paid"]
    if not _in_window(order, as_of, window_days):
        return [f"the order is outside the {window_days}-day refund window"]
    if order.remaining <= 0:
        return ["the order is already fully refunded"]
    return []


def decide(*, amount: Decimal, currency: str, order: Order, as_of: datetime, limits: Limits) -> Verdict:
    """Pay now, ask a person, or refuse. The same rules run again right before paying."""
    room = refundable(order, as_of, limits.window_days)
    reasons = blockers(order, as_of, limits.window_days)
    if currency != order.currency:
        reasons.append(f"currency {currency} does not match the order's {order.currency}")
    if amount <= 0:
        reasons.append("no refund amount was proposed")
    elif quantize(amount, order.currency) != amount:
        reasons.append(f"amount {amount} is not a whole number of {order.currency} minor units")
    if amount > room and not reasons:
        reasons.append(f"amount {amount} exceeds the refundable {room} {order.currency}")
    cap = limits.absolute_cap_for(currency)
    if amount > cap:
        reasons.append(f"amount {amount} is above the absolute cap of {cap} {currency}")
    if reasons:
        return Verdict(kind="refuse", amount=amount, currency=currency, reasons=tuple(reasons), refundable=room)
    auto = limits.auto_approve_for(currency)
    if amount > auto:
        return Verdict(
            kind="needs_approval",
            amount=amount,
            currency=currency,
            reasons=(f"amount is above the auto-approve limit of {auto} {currency}",),
            refundable=room,
        )
    return Verdict(kind="auto_approve", amount=amount, currency=currency, refundable=room)
