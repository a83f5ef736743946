"""What the sandbox payments ledger keeps and answers: charges and refunds (each in Stripe's JSON shape), and what
claiming an idempotency key, applying a refund or settling one comes to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Charge:
    id: str
    amount: int
    currency: str
    amount_refunded: int = 0
    payment_intent: str | None = None
    created: int = 0

    def to_stripe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "charge",
            "amount": self.amount,
            "amount_captured": self.amount,
            "amount_refunded": self.amount_refunded,
            "currency": self.currency,
            "captured": True,
            "paid": True,
            "refunded": self.amount_refunded >= self.amount,
            "payment_intent": self.payment_intent,
            "status": "succeeded",
            "created": self.created,
        }


@dataclass(frozen=True)
class Refund:
    id: str
    charge: str
    amount: int
    currency: str
    reason: str | None
    metadata: dict[str, str]
    created: int
    status: str = "succeeded"
    payment_intent: str | None = None
    failure_reason: str | None = None
    settle_at: float | None = field(default=None, compare=False)
    settle_to: str | None = field(default=None, compare=False)
    settle_failure_reason: str | None = field(default=None, compare=False)

    def to_stripe(self) -> dict[str, Any]:
        fields = ("amount", "currency", "charge", "payment_intent", "status", "failure_reason", "reason")
        return (
            {"id": self.id, "object": "refund"}
            | {f: getattr(self, f) for f in fields}
            | {
                "metadata": self.metadata,
                "created": self.created,
            }
        )


@dataclass(frozen=True)
class Claimed:
    """The caller now owns the key and must either save a response for it or release it."""

    token: str


@dataclass(frozen=True)
class Replay:
    status_code: int
    body: str


@dataclass(frozen=True)
class Conflict:
    reason: Literal["in_flight", "mismatch"]


ClaimResult = Claimed | Replay | Conflict


@dataclass(frozen=True)
class Refused:
    """The charge cannot take the refund: Stripe's error code and message."""

    code: Literal["resource_missing", "charge_already_refunded", "amount_too_large", "charge_disputed"]
    message: str
    param: str | None = "amount"


@dataclass(frozen=True)
class Settled:
    refund: Refund
    event_type: str
