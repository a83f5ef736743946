"""What the customer is told shows money the way approvers and the console see it (one format everywhere)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agent.domain import declined_reply, paid_reply


@pytest.mark.parametrize(
    ("amount", "currency", "shown"), [("4200", "USD", "4,200.00 USD"), ("1234567", "JPY", "1,234,567 JPY")]
)
def test_customer_replies_show_the_amount_with_thousands_separators(amount: str, currency: str, shown: str) -> None:
    assert f"Your refund of {shown} has been approved and sent." in paid_reply(Decimal(amount), currency)
    assert f"we cannot refund {shown} on this order." in declined_reply(Decimal(amount), currency)
