"""Plain data that steps read and return (stored in DBOS checkpoints as JSON naming each class: never rename these)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from babel.numbers import format_currency, get_currency_precision
from pydantic import BaseModel, ConfigDict

OrderStatus = Literal["paid", "unpaid", "disputed"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$"
"""Operator, API client and OS user names: no ``:`` (so no channel prefix can be typed), no spaces, at most 100."""

Scope = Literal["refunds:create", "refunds:read", "approvals:decide", "admin"]
#: What an API client may do: submit refunds, read its own, decide others' approvals; ``admin`` implies them all.
SCOPES: tuple[Scope, ...] = ("refunds:create", "refunds:read", "approvals:decide", "admin")


#: The ISO 4217 currencies the product settles. Their minor units come from CLDR (Babel), not from a table here.
SUPPORTED_CURRENCIES: tuple[str, ...] = ("USD", "EUR", "GBP", "CHF", "JPY", "KWD")

#: Limits are set once in a base currency (USD) and count in another currency as this many of its units per
#: base unit (round figures for limits, not exchange rates): 100 USD auto-approves 15,000 JPY or 30.000 KWD.
#: A limit set for a currency itself (``AUTO_APPROVE_LIMITS``...) wins; a currency not listed counts one for one.
LIMIT_SCALES: dict[str, Decimal] = {
    "USD": Decimal(1),
    "EUR": Decimal(1),
    "GBP": Decimal(1),
    "CHF": Decimal(1),
    "JPY": Decimal(150),
    "KWD": Decimal("0.3"),
}

#: How money is written everywhere it is shown (replies, console, API errors, approvers' messages): English digit
#: grouping, the currency's minor units, then its ISO code: "12,000.00 USD", "15,000 JPY", "1.250 KWD".
MONEY_LOCALE = "en"
MONEY_PATTERN = "#,##0.00\u00a0\u00a4\u00a4"

#: Stripe takes amounts of three-decimal currencies only in whole tens of minor units (5.124 KWD must be sent as
#: 5120 or 5130): the product accepts and pays such amounts only in steps of 10 minor units.
STRIPE_THREE_DECIMAL_STEP = 10


class UnsupportedCurrencyError(ValueError):
    pass


def supported(currency: str) -> bool:
    return currency in SUPPORTED_CURRENCIES


def exponent(currency: str) -> int:
    """The currency's minor-unit exponent (ISO 4217 via CLDR): 2 for USD, 0 for JPY, 3 for KWD."""
    if currency not in SUPPORTED_CURRENCIES:
        raise UnsupportedCurrencyError(f"unsupported currency {currency!r}")
    return get_currency_precision(currency)


def quantize(amount: Decimal, currency: str) -> Decimal:
    """Round an amount to the currency's minor unit."""
    return amount.quantize(Decimal(1).scaleb(-exponent(currency)), rounding=ROUND_HALF_UP)


def to_minor(amount: Decimal, currency: str) -> int:
    return int(quantize(amount, currency).scaleb(exponent(currency)))


def from_minor(minor: int, currency: str) -> Decimal:
    return quantize(Decimal(minor).scaleb(-exponent(currency)), currency)


def payable_step(currency: str) -> int:
    """The smallest amount, in minor units, that a refund in ``currency`` moves by: 1, or 10 for three-decimal
    currencies (the payment provider's rule)."""
    return STRIPE_THREE_DECIMAL_STEP if exponent(currency) == 3 else 1


def minor_unit_problem(amount: Decimal, currency: str) -> str | None:
    """Why ``amount`` cannot be paid in ``currency`` as written (finer than its minor unit, or off the payable
    step), or None. The currency must be supported."""
    places = exponent(currency)
    if amount != quantize(amount, currency):
        units = "no minor unit (0 decimal places)" if places == 0 else f"{places} decimal places"
        return f"amount {amount} is finer than {currency} allows: {currency} has {units}"
    step = payable_step(currency)
    if step > 1 and to_minor(amount, currency) % step:
        return (
            f"amount {amount} cannot be paid in {currency}: {currency} refunds move in steps of "
            f"{format_money(from_minor(step, currency), currency)}"
        )
    return None


def format_money(amount: Decimal, currency: str) -> str:
    """Money the one way the product shows it (``MONEY_PATTERN``), rounded half up to the currency's minor unit."""
    shown = format_currency(quantize(amount, currency), currency, format=MONEY_PATTERN, locale=MONEY_LOCALE)
    return shown.replace("\u00a0", " ")


def format_moment(at: datetime) -> str:
    """A moment the one way people are shown it in words (replies, the console's paid line): 3 Dec 2026 14:05 UTC."""
    at = at.astimezone(UTC)
    return f"{at.day} {at:%b %Y %H:%M} UTC"


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        # Releases before JSON checkpoints pickled records (read once, when the migration rewrites them as JSON): one
        # pickled before an optional field existed lacks it, so it gets the field's default (JSON gets defaults from
        # validation). A field without a default is never added to a record.
        fields = state.get("__dict__")
        if isinstance(fields, dict):
            for name, info in type(self).model_fields.items():
                if name not in fields and not info.is_required():
                    fields[name] = info.get_default(call_default_factory=True)
        super().__setstate__(state)


class Order(Record):
    order_id: str
    customer_id: str
    customer_name: str
    currency: str
    amount_captured: Decimal
    amount_refunded: Decimal
    status: OrderStatus
    paid_at: datetime | None
    charge_id: str
    items: list[str]
    notes: str = ""
    customer_email: str = ""
    carrier: str = ""
    """The shipment's carrier and tracking code; empty when the order was never shipped."""
    tracking_code: str = ""
    shipping_address: str = ""
    """Where it was shipped, as the customer typed it; empty when never shipped (or recorded before addresses)."""
    card_fingerprint: str = ""
    """The paying card's fingerprint as the payment provider gave it at checkout (the same card gives the same
    fingerprint under any customer account); empty when not paid by card."""

    @property
    def remaining(self) -> Decimal:
        return self.amount_captured - self.amount_refunded


class OrderSnapshot(Record):
    """An order as read at ``as_of``; the workflow's only source of the current time."""

    order: Order
    as_of: datetime


class PastRefund(Record):
    refund_id: str
    order_id: str
    amount: Decimal
    currency: str
    status: str
    """The refund's phase (``completed``, ``awaiting_approval``, ...); a provider refund's in the same words."""
    created_at: datetime
    claim_category: str = ""
    """The claim the agent filed it under; empty before claims were recorded, and for provider refunds."""
    linked_by: str = ""
    """Empty for the order's own customer; else the identity it shares with them under another customer id:
    ``email``, ``address`` or ``card``."""
    outside: bool = False
    """True for a refund the payment provider made that this service did not (a dashboard refund, another system)."""


def email_key(email: str) -> str:
    """One mailbox, however it is written: case and surrounding space ignored, and a ``+tag`` (which delivers to
    the same mailbox at the big providers) dropped. Empty for an empty address."""
    local, at, domain = email.strip().casefold().partition("@")
    return f"{local.split('+', 1)[0]}{at}{domain}" if at else local


def address_key(address: str) -> str:
    """One shipping address, however it is written: case, punctuation and runs of whitespace ignored."""
    return " ".join(re.sub(r"[^\w\s]", " ", address.casefold()).split())


class ModelUsage(Record):
    """What deciding one refund cost at the model: requests and tokens (Pydantic AI's RunUsage)."""

    model: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class CaseFile(Record):
    """What a refund is judged on, read in one step: the order as of now and its customer's refunds."""

    snapshot: OrderSnapshot | None
    """None: no such order."""
    history: list[PastRefund] = []
    """The claimant's newest refund requests across their orders, newest first: the order's customer's, and those
    of every customer id that shares the order's email, shipping address or card (``linked_by``)."""
    open_claims: list[PastRefund] = []
    """The order's refunds that have not ended (this one among them), oldest first: a second claim on one order
    waits for the first. Empty in case files recorded before it was read."""
    charges: dict[str, str] = {}
    """The claimant's most recently paid charges (charge id -> order id): where refunds made outside this service
    are looked up. Empty in case files recorded before it was read."""


#: A Stripe refund's status: only ``succeeded`` means the money was sent; ``pending`` and
#: ``requires_action`` may still end either way; ``failed`` and ``canceled`` are final and sent nothing.
ProviderRefundStatus = Literal["pending", "requires_action", "succeeded", "failed", "canceled"]


class ProviderRefund(Record):
    provider_refund_id: str
    amount: Decimal
    currency: str
    status: ProviderRefundStatus
    idempotency_key: str
    replayed: bool = False
    reconciled: bool = False
    #: Stripe's reason when ``status`` is ``failed`` (e.g. ``expired_or_canceled_card``).
    failure_reason: str | None = None
    #: The charge it refunds, and the base key its metadata carries (``metadata.idempotency_key``): what ties it
    #: to one of our refunds. None in records from before they were read, and when the provider sent none.
    charge: str | None = None
    metadata_key: str | None = None


class AuditEntry(Record):
    seq: int
    refund_id: str
    event: str
    payload: dict[str, Any]
    created_at: datetime
    prev_hash: str
    hash: str


class ApprovalRecord(Record):
    """The one recorded decision for a refund (first writer wins)."""

    refund_id: str
    decision: Literal["approve", "reject", "expired"]
    approver: str
    amount: Decimal
    currency: str
    decided_at: datetime
    note: str = ""
    via: str = ""
    """The channel it came through: ``console``, ``link``, ``api``, ``cli``, ``slack:<team>/<user>``, ``deadline``."""


class ApprovalRequest(Record):
    """What a refund parked for approval waits on: the amount a person is asked to approve, and when."""

    refund_id: str
    amount: Decimal
    currency: str
    reason: str
    requested_at: datetime
    escalate_at: datetime
    expires_at: datetime
    escalated_at: datetime | None = None
    requested_by: str | None = None
    """The principal that submitted the refund (``client:helpdesk``); it may not decide it."""
    requester_operator: str | None = None
    """The operator the requesting client acts for, if any; nor may they."""


class ApiClient(Record):
    """An API client: its key is kept only as a SHA-256 hash; ``operator`` is the person it acts for, if any."""

    client_id: str
    name: str
    scopes: tuple[Scope, ...]
    operator: str | None = None
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    def allows(self, scope: Scope) -> bool:
        return self.revoked_at is None and (scope in self.scopes or "admin" in self.scopes)
