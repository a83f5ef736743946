"""The money rules' limits: what is paid without a person, what is refused, and the windows refunds are counted in."""

from __future__ import annotations

from decimal import Decimal

from pydantic import Field, field_validator

from agent.settings.part import Part, money_limit
from steps.records import LIMIT_SCALES, SUPPORTED_CURRENCIES, supported


class PolicySettings(Part):
    """The limits agent/policy.py decides with."""

    auto_approve_limit: Decimal = Decimal("100.00")
    """Refunds up to this amount are paid without a person. In the base currency (USD); in another currency it
    counts times ``LIMIT_SCALES`` (15,000 JPY, 30.000 KWD by default) unless ``AUTO_APPROVE_LIMITS`` names it."""
    auto_approve_limits: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency auto-approve limits, in that currency, e.g. ``{"JPY": "20000"}``: they replace the scaled
    ``AUTO_APPROVE_LIMIT`` for the currencies named."""
    absolute_refund_cap: Decimal = Decimal("10000.00")
    """Refunds above this amount are refused outright. In the base currency (USD), scaled like
    ``AUTO_APPROVE_LIMIT`` (1,500,000 JPY, 3,000.000 KWD by default)."""
    absolute_refund_caps: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency caps, as ``AUTO_APPROVE_LIMITS`` is for ``AUTO_APPROVE_LIMIT``."""
    limit_scales: dict[str, Decimal] = Field(default_factory=lambda: dict(LIMIT_SCALES))
    """How many units of a currency one base-currency (USD) unit of a limit counts as, for the limits not set per
    currency: ``{"USD": 1, "EUR": 1, "GBP": 1, "CHF": 1, "JPY": 150, "KWD": 0.3}``, round figures rather than
    exchange rates. Currencies given are merged over these (``{"JPY": 140}`` changes JPY only)."""
    refund_window_days: int = 60
    """Refundable through this many whole days after payment (the last day included)."""
    customer_refund_window_days: int = Field(default=30, ge=1)
    """The rolling window in which one customer's refunds are counted (``CUSTOMER_MAX_REFUNDS``, ``..._AMOUNT``)."""
    customer_max_refunds: int = Field(default=3, ge=1)
    """More refunds than this for one customer inside the window go to a person, however small. One customer is
    every customer id sharing the order's email, shipping address or card, and refunds made at the payment provider
    outside this service count; refused and failed refunds are not counted."""
    customer_max_refund_amount: Decimal = Field(default=Decimal("500.00"), gt=0)
    """More money than this for one customer inside the window goes to a person. In the base currency (USD), scaled
    like ``AUTO_APPROVE_LIMIT`` (75,000 JPY, 150.000 KWD by default)."""
    order_max_open_claims: int = Field(default=1, ge=1)
    """Claims open on one order at once (received, deciding, waiting for a person, paying or settling): a claim made
    after this many goes to a person, never paid on its own, so a customer cannot switch their story on one order.
    Raise it only to load-test many refunds of one order at once."""
    customer_max_refund_amounts: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency overrides of ``CUSTOMER_MAX_REFUND_AMOUNT``, in that currency, e.g. ``{"JPY": "80000"}``."""

    @field_validator("auto_approve_limit", "absolute_refund_cap")
    @classmethod
    def _positive(cls, value: Decimal) -> Decimal:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("auto_approve_limits", "absolute_refund_caps", "customer_max_refund_amounts")
    @classmethod
    def _per_currency(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        return {code: money_limit(code, amount) for code, amount in ((c.strip().upper(), a) for c, a in value.items())}

    @field_validator("limit_scales")
    @classmethod
    def _scales(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        given = {code.strip().upper(): scale for code, scale in value.items()}
        for code, scale in given.items():
            if not supported(code):
                raise ValueError(f"unsupported currency {code!r}; supported: {', '.join(SUPPORTED_CURRENCIES)}")
            if scale <= 0:
                raise ValueError(f"the scale of {code} must be positive")
        return {**LIMIT_SCALES, **given}
