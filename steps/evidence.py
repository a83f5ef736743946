"""Evidence about a claim, as the look-ups return it: the carrier's tracking, the warehouse's returns, the payment's
risk signals and the customer's earlier tickets (the look-ups themselves, one DBOS step each, are steps/lookups.py).

What the look-ups return is checkpointed, and policy judges the refund on those checkpointed records, never on the
model's summary. The records are stored in DBOS checkpoints as JSON naming their module and class
(agent/ops/checkpoints.py): never move them out of this module, and never rename them or their fields.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

from steps.records import Record

TrackingStatus = Literal[
    "pre_transit", "in_transit", "out_for_delivery", "delivered", "return_to_sender", "failure", "unknown"
]
DeliveryProof = Literal["signature", "photo", "none"]


class TrackingEvent(Record):
    status: TrackingStatus
    message: str
    at: datetime
    place: str = ""
    """City, state and country as the carrier reports it; empty when it reports none."""


class Tracking(Record):
    """What the carrier says about a shipment (an EasyPost tracker)."""

    carrier: str
    tracking_code: str
    found: bool = True
    """False: the carrier knows no shipment under this code (status is then ``unknown``)."""
    status: TrackingStatus = "unknown"
    est_delivery: datetime | None = None
    delivered_at: datetime | None = None
    proof: DeliveryProof = "none"
    signed_by: str = ""
    events: list[TrackingEvent] = []
    """Oldest first."""

    @property
    def last_event(self) -> TrackingEvent | None:
        return self.events[-1] if self.events else None


ReturnStatus = Literal["none", "label_created", "in_transit", "received", "inspected"]
LineCondition = Literal["new", "opened", "used", "damaged", "missing", "unknown"]


class ReturnLine(Record):
    description: str
    quantity: int
    amount: Decimal
    """What the line was paid, in the order's currency."""
    received: bool = False
    condition: LineCondition = "unknown"


class ReturnReceipt(Record):
    """The warehouse's return (RMA) for an order; ``status`` ``none``: no return was ever opened."""

    order_id: str
    rma_id: str = ""
    status: ReturnStatus = "none"
    currency: str = ""
    label_created_at: datetime | None = None
    shipped_at: datetime | None = None
    received_at: datetime | None = None
    lines: list[ReturnLine] = []

    @property
    def received_amount(self) -> Decimal:
        return sum((line.amount for line in self.lines if line.received), Decimal(0))


DisputeStatus = Literal[
    "warning_needs_response", "warning_under_review", "warning_closed", "needs_response", "under_review", "won", "lost"
]
OPEN_DISPUTE_STATUSES: frozenset[str] = frozenset(
    {"warning_needs_response", "warning_under_review", "needs_response", "under_review"}
)


class FraudWarning(Record):
    """A Stripe Radar early fraud warning: the card issuer reported the charge as fraud."""

    warning_id: str
    fraud_type: str
    actionable: bool
    created: datetime


class Dispute(Record):
    dispute_id: str
    status: DisputeStatus
    reason: str
    amount: Decimal
    currency: str
    created: datetime

    @property
    def open(self) -> bool:
        return self.status in OPEN_DISPUTE_STATUSES


class RiskSignals(Record):
    """The payment's risk on its charge: early fraud warnings and disputes, as the payment provider holds them."""

    charge_id: str
    early_fraud_warnings: list[FraudWarning] = []
    disputes: list[Dispute] = []

    @property
    def open_disputes(self) -> list[Dispute]:
        return [d for d in self.disputes if d.open]


AuthorRole = Literal["end-user", "agent", "admin"]


class TicketComment(Record):
    author_role: AuthorRole
    body: str
    at: datetime


class Ticket(Record):
    ticket_id: str
    subject: str
    status: str
    created_at: datetime
    comments: list[TicketComment] = []


class TicketHistory(Record):
    """The customer's earlier support tickets, newest first (a Zendesk search by requester)."""

    email: str
    tickets: list[Ticket] = []


LookUp = Literal["tracking", "returns", "risk", "tickets"]


#: What a refund may ask its customer for (agent/questions.py): durable, recorded with every question.
QuestionKind = Literal["delivery", "photo", "return_tracking"]
QUESTION_KINDS: tuple[QuestionKind, ...] = ("delivery", "photo", "return_tracking")


class AnswerFile(Record):
    """A file the customer sent with an answer: described, never executed or shown. Uploaded through the answer
    link it is stored (``stored``), identified by its SHA-256; sent on a help-desk comment it is a reference
    (``url``, never fetched)."""

    name: str = ""
    content_type: str
    """The type its bytes show (an uploaded file) or the help desk reported (a reference)."""
    size: int
    sha256: str = ""
    url: str = ""
    stored: bool = False

    @property
    def image(self) -> bool:
        return self.size > 0 and self.content_type in ("image/jpeg", "image/png", "image/gif", "image/webp")


class CustomerAnswer(Record):
    """The customer's answer to the refund's question, as recorded: evidence policy judges the refund again with."""

    question: QuestionKind
    text: str = ""
    """Their words, plain text (never rendered unescaped)."""
    received: bool | None = None
    """For ``delivery``, what the form's choice said: False (still not received), True (it arrived); None: read
    from their words."""
    tracking_number: str = ""
    """For ``return_tracking``: the return parcel's tracking number they gave."""
    files: list[AnswerFile] = []
    via: str = ""
    """``link`` (the signed answer link) or ``helpdesk:<comment id>``."""
    answered_at: datetime | None = None


class Evidence(Record):
    """What the agent looked up for one refund, as the steps returned it (None: not looked up)."""

    tracking: Tracking | None = None
    returns: ReturnReceipt | None = None
    risk: RiskSignals | None = None
    tickets: TicketHistory | None = None
    failed: dict[str, str] = {}
    """Look-ups that failed through their retries: look-up -> what went wrong (no secret, no body)."""
    answer: CustomerAnswer | None = None
    """The customer's answer to the refund's question, once judged again with it; None: nothing was asked."""

    def looked_up(self) -> list[LookUp]:
        names: tuple[LookUp, ...] = ("tracking", "returns", "risk", "tickets")
        return [name for name in names if getattr(self, name) is not None]

    @property
    def empty(self) -> bool:
        return not self.looked_up() and not self.failed
