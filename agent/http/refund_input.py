"""The body of ``POST /refunds`` and the rules its fields follow, each broken rule said in its own words."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: ASCII digits (``\d`` would also match "٤٢"); up to 3 decimals, KWD's, the finest supported currency: whether
#: the order's currency has that many is checked against the order (agent.submit).
AMOUNT_PATTERN = r"^[0-9]{1,12}(\.[0-9]{1,3})?$"
_AMOUNT = re.compile(AMOUNT_PATTERN)
CURRENCY_PATTERN = r"^[A-Za-z]{3}$"
_CURRENCY = re.compile(CURRENCY_PATTERN)
_EXAMPLE = '"42.50"'


def amount_problem(text: str) -> str | None:
    """What is wrong with ``text`` as an amount (one reason, the first that applies), or None."""
    if not text.strip():
        return "amount is empty: leave it out (or null) for the whole refundable balance"
    if text != text.strip():
        return f"amount must be the number alone, without spaces around it ({_EXAMPLE})"
    if not text.isascii():
        return f"amount must be written with the ASCII digits 0-9 ({_EXAMPLE})"
    if text.startswith("-"):
        return "amount must be more than 0: a refund is never negative"
    if text.startswith("+"):
        return f"amount takes no sign: write the digits alone ({_EXAMPLE})"
    if "," in text:
        return 'amount takes no thousands separators and marks decimals with a point ("1234.50")'
    try:
        number = Decimal(text)
    except InvalidOperation:
        number = None
    if number is not None and not number.is_finite():
        return f"amount must be a finite number of money, not {text!r}"
    if number is not None and "e" in text.lower():
        return f'amount must be written out in digits, without an exponent ("1000.00", not "{text}")'
    whole, point, fraction = text.partition(".")
    if number is None or not whole.isdigit() or (point and not fraction.isdigit()):
        return f"amount must be a decimal string such as {_EXAMPLE}: digits, then optionally a point and decimals"
    if len(whole) > 12:
        return "amount is too large: at most 12 digits before the decimal point"
    if len(fraction) > 3:
        return f"amount has {len(fraction)} decimal places; no supported currency has more than 3"
    return None


class RefundIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(min_length=1, max_length=64, examples=["ord_1001"])
    message: str = Field(
        min_length=1, max_length=4000, description="the customer's words, verbatim", examples=["The mouse broke."]
    )
    amount: str | None = Field(
        default=None,
        description='what the customer asks for, as a decimal string ("42.50", not 42.5) with no more decimals '
        "than the order's currency has (USD 2, JPY 0, KWD 3); omit for the full refundable balance",
        examples=["42.50"],
        json_schema_extra={"pattern": AMOUNT_PATTERN},
    )
    currency: str | None = Field(
        default=None,
        description="ISO 4217 code of the order's currency, in any case: `usd` is `USD` (as Stripe takes it), and "
        "the refund is answered in upper case; another currency than the order's is refused (default: the order's)",
        examples=["USD"],
        json_schema_extra={"pattern": CURRENCY_PATTERN},
    )

    @field_validator("amount", mode="before")
    @classmethod
    def _decimal_string(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str):
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ValueError(f"amount must be a decimal string such as {_EXAMPLE}, not the JSON value {shown}")
        if problem := amount_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("currency", mode="before")
    @classmethod
    def _currency_code(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str) or not _CURRENCY.match(value):
            raise ValueError('currency must be a three-letter ISO 4217 code such as "USD"')
        return value.upper()
