"""The seed format of the evidence sandbox (and of the payments sandbox's risk signals).

What a carrier, a warehouse, a helpdesk and a payment provider hold about orders, written so that it stays
consistent with orders seeded relative to now: every time is an offset from the moment the sandbox loads
the seed (``When``: negative days are the past, positive the future). The sandbox turns offsets into
absolute times once, at load, so the answers do not drift while it runs.

The sandbox imports nothing of the product's; the demo's seed is built in ``steps/seed_evidence.py`` and
evaluation cases may write their own in this format (JSON or YAML through ``EvidenceSeed.model_validate``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TrackerStatus = Literal[
    "pre_transit", "in_transit", "out_for_delivery", "delivered", "return_to_sender", "failure", "unknown"
]
ReturnState = Literal["label_created", "in_transit", "received", "inspected", "cancelled"]
Condition = Literal["new", "opened", "used", "damaged", "missing", "unknown"]
AuthorRole = Literal["end-user", "agent", "admin"]
TicketStatus = Literal["new", "open", "pending", "hold", "solved", "closed"]
DisputeState = Literal[
    "warning_needs_response", "warning_under_review", "warning_closed", "needs_response", "under_review", "won", "lost"
]


class _Seed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class When(_Seed):
    """A moment relative to when the seed is loaded: ``{"days": -2, "hours": -3}`` is 2 days 3 hours ago."""

    days: float = 0
    hours: float = 0

    def at(self, now: datetime) -> datetime:
        return now + timedelta(days=self.days, hours=self.hours)


def ago(days: float = 0, hours: float = 0) -> When:
    """``When`` in the past, for readable seeds: ``ago(2)`` is two days ago."""
    return When(days=-days, hours=-hours)


def ahead(days: float = 0, hours: float = 0) -> When:
    return When(days=days, hours=hours)


# --- carrier tracking (served EasyPost-shaped) ---


class TrackingEventSeed(_Seed):
    at: When
    status: TrackerStatus
    message: str
    status_detail: str = "unknown"
    """EasyPost's finer status, e.g. ``arrived_at_destination``, ``return``, ``label_created``."""
    city: str = ""
    state: str = ""
    country: str = ""
    zip: str = ""


class TrackerSeed(_Seed):
    carrier: str
    """As the store records it (``USPS``, ``UPS``, ...); matched case-insensitively."""
    tracking_code: str
    status: TrackerStatus
    status_detail: str = "unknown"
    est_delivery: When | None = None
    signed_by: str = ""
    """Who signed for the parcel; non-empty means a signature is the proof of delivery."""
    photo: bool = False
    """The carrier holds a photo of the parcel at the door (served as ``carrier_detail.proof_of_delivery``)."""
    events: list[TrackingEventSeed] = []
    """Oldest first; the last one's time is the delivery time when the status is ``delivered``."""


# --- warehouse returns (served ShipBob-shaped) ---


class ReturnLineSeed(_Seed):
    sku: str = ""
    description: str
    quantity: int = Field(default=1, ge=1)
    amount: Decimal = Field(ge=0)
    """What the customer paid for the line, in the return's currency."""
    received: bool = False
    condition: Condition = "unknown"
    """What inspection found; ``unknown`` until the line is inspected."""


class ReturnSeed(_Seed):
    order_id: str
    """The store's order id (the return's ``reference_id``)."""
    rma_id: int | None = None
    """The warehouse's return id; assigned in load order when not given."""
    state: ReturnState
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    label_created: When
    shipped: When | None = None
    received: When | None = None
    lines: list[ReturnLineSeed] = Field(min_length=1)


# --- earlier tickets (served Zendesk-shaped) ---


class CommentSeed(_Seed):
    role: AuthorRole
    author_name: str
    """With ``role`` identifies the author: one user per (name, role); end-users use the requester's email."""
    body: str
    at: When


class TicketSeed(_Seed):
    id: int | None = None
    """Zendesk ticket id; assigned in load order when not given."""
    requester_email: str
    requester_name: str
    subject: str
    status: TicketStatus
    created: When
    comments: list[CommentSeed] = []
    """Oldest first; the first is the ticket's description."""


class EvidenceSeed(_Seed):
    """Everything the evidence sandbox serves; ``PUT /_sandbox/data`` replaces it whole."""

    trackers: list[TrackerSeed] = []
    returns: list[ReturnSeed] = []
    tickets: list[TicketSeed] = []


# --- payment risk (served by the payments sandbox, Stripe-shaped) ---


class FraudWarningSeed(_Seed):
    charge: str = Field(pattern=r"^ch_[A-Za-z0-9_]{1,250}$")
    fraud_type: Literal[
        "card_never_received",
        "fraudulent_card_application",
        "made_with_counterfeit_card",
        "made_with_lost_card",
        "made_with_stolen_card",
        "misc",
        "unauthorized_use_of_card",
    ]
    actionable: bool = True
    created: When


class DisputeSeed(_Seed):
    charge: str = Field(pattern=r"^ch_[A-Za-z0-9_]{1,250}$")
    amount: int = Field(ge=1)
    """Minor units, as Stripe gives amounts."""
    currency: str = Field(pattern=r"^[a-z]{3}$")
    reason: str = "general"
    status: DisputeState = "needs_response"
    created: When


class RiskSeed(_Seed):
    """Early fraud warnings and disputes; ``PUT /_sandbox/risk`` on the payments sandbox replaces them."""

    early_fraud_warnings: list[FraudWarningSeed] = []
    disputes: list[DisputeSeed] = []


def utcnow() -> datetime:
    return datetime.now(UTC)
