"""Pure rules about claimants: one open claim per order, and one repeat claimant across the customer ids, email,
address and card an order holds, and across refunds made at the payment provider outside this service."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agent.policy import Claim, Limits, decide
from steps.evidence import Evidence, RiskSignals
from steps.records import Order, PastRefund, address_key, email_key

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)
LIMITS = Limits(
    auto_approve=Decimal("100.00"),
    absolute_cap=Decimal("10000.00"),
    window_days=60,
    customer_window_days=30,
    customer_max_refunds=3,
    customer_max_amount=Decimal("200.00"),
)
ORDER = Order(
    order_id="ord_x",
    customer_id="cus_x",
    customer_name="X",
    customer_email="x@example.com",
    currency="USD",
    amount_captured=Decimal("42.00"),
    amount_refunded=Decimal(0),
    status="paid",
    paid_at=NOW - timedelta(days=5),
    charge_id="ch_x",
    items=["Wireless mouse"],
)


def claim_on_order(refund_id: str, status: str, *, minutes_ago: int, category: str = "") -> PastRefund:
    return PastRefund(
        refund_id=refund_id,
        order_id="ord_x",
        amount=Decimal("42.00"),
        currency="USD",
        status=status,
        created_at=NOW - timedelta(minutes=minutes_ago),
        claim_category=category,
    )


def past(n: int, *, linked_by: str = "", outside: bool = False, status: str = "completed") -> list[PastRefund]:
    return [
        PastRefund(
            refund_id=f"{'re_' if outside else 'r'}{linked_by}{i}",
            order_id=f"ord_{i}",
            amount=Decimal("10.00"),
            currency="USD",
            status=status,
            created_at=NOW - timedelta(days=3),
            linked_by=linked_by,
            outside=outside,
        )
        for i in range(n)
    ]


def verdict_on(claim: Claim, amount: str = "42.00") -> tuple[str, tuple[str, ...]]:
    """Policy's verdict with the charge read clean, as the workflow reads it before any payment at once."""
    if claim.evidence.risk is None:
        claim = replace(claim, evidence=claim.evidence.model_copy(update={"risk": RiskSignals(charge_id="ch_x")}))
    verdict = decide(amount=Decimal(amount), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    return verdict.kind, verdict.reasons


THIS = claim_on_order("this", "deciding", minutes_ago=0)


@pytest.mark.parametrize("status", ["received", "deciding", "awaiting_approval", "paying", "settling"])
def test_a_second_claim_while_the_first_is_open_goes_to_a_person_naming_it(status: str) -> None:
    first = claim_on_order("first", status, minutes_ago=10, category="not_received")
    kind, reasons = verdict_on(Claim(category="damaged", refund_id="this", open_claims=[first, THIS]))
    assert kind == "needs_approval"
    assert reasons[0].startswith(f"refund first of this order is still open ({status.replace('_', ' ')}, claimed")
    assert "claimed as not_received" in reasons[0]


@pytest.mark.parametrize("status", ["completed", "rejected", "failed", "cancelled"])
def test_an_earlier_claim_that_ended_does_not_hold_the_order(status: str) -> None:
    first = claim_on_order("first", status, minutes_ago=10)
    assert verdict_on(Claim(category="damaged", refund_id="this", open_claims=[first, THIS]))[0] == "auto_approve"


def test_a_later_claim_deciding_or_waiting_does_not_hold_back_the_earlier_one() -> None:
    """Two claims at once: the earlier is judged on its own, the later waits (else each would wait for the other)."""
    for status in ("received", "deciding", "awaiting_approval"):
        later = claim_on_order("later", status, minutes_ago=-1)
        kind, _ = verdict_on(Claim(category="damaged", refund_id="this", open_claims=[THIS, later]))
        assert kind == "auto_approve", status


@pytest.mark.parametrize("status", ["paying", "settling"])
def test_a_claim_moving_money_holds_the_order_whenever_it_was_made(status: str) -> None:
    later = claim_on_order("later", status, minutes_ago=-1)
    kind, reasons = verdict_on(Claim(category="damaged", refund_id="this", open_claims=[THIS, later]))
    assert kind == "needs_approval" and "refund later of this order is still open" in reasons[0]


def test_a_refund_whose_own_row_is_missing_counts_every_open_claim_as_earlier() -> None:
    later = claim_on_order("later", "deciding", minutes_ago=-1)
    assert verdict_on(Claim(category="damaged", refund_id="this", open_claims=[later]))[0] == "needs_approval"


def test_a_load_test_may_allow_more_claims_open_on_one_order() -> None:
    first = claim_on_order("first", "deciding", minutes_ago=10)
    read = Evidence(risk=RiskSignals(charge_id="ch_x"))
    claim = Claim(category="damaged", evidence=read, refund_id="this", open_claims=[first, THIS])
    many = replace(LIMITS, order_max_open_claims=2)
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=many, claim=claim)
    assert verdict.kind == "auto_approve"


@pytest.mark.parametrize("linked_by", ["email", "address", "card"])
def test_refunds_under_a_second_customer_id_sharing_an_identity_count(linked_by: str) -> None:
    kind, reasons = verdict_on(Claim(category="damaged", refund_id="this", history=past(3, linked_by=linked_by)), "5")
    assert kind == "needs_approval"
    assert "refund number 4 in the last 30 days" in reasons[0]
    assert f"3 under another customer id with the same {linked_by}" in reasons[0]


def test_refunds_made_at_the_provider_outside_the_service_count() -> None:
    kind, reasons = verdict_on(Claim(category="damaged", refund_id="this", outside=past(3, outside=True)), "5")
    assert kind == "needs_approval"
    assert "refund number 4" in reasons[0] and "3 made at the payment provider outside this service" in reasons[0]


def test_outside_refunds_count_toward_the_money_limit() -> None:
    big = [r.model_copy(update={"amount": Decimal("90.00")}) for r in past(2, outside=True)]
    kind, reasons = verdict_on(Claim(category="damaged", refund_id="this", outside=big), "42.00")
    assert kind == "needs_approval" and "would total 222.00 USD, above 200.00 USD" in reasons[0]


def test_outside_refunds_that_failed_or_were_canceled_do_not_count() -> None:
    gone = [*past(2, outside=True, status="failed"), *past(2, outside=True, status="cancelled")]
    assert verdict_on(Claim(category="damaged", refund_id="this", outside=gone), "5")[0] == "auto_approve"


def test_one_refund_seen_twice_is_counted_once() -> None:
    twice = past(2)
    assert verdict_on(Claim(category="damaged", refund_id="this", history=twice, outside=twice), "5")[0] == (
        "auto_approve"
    )


@pytest.mark.parametrize(
    ("written", "key"),
    [
        ("Ada@Example.com", "ada@example.com"),
        ("  ada@example.com\t", "ada@example.com"),
        ("ADA+shop@EXAMPLE.COM", "ada@example.com"),
        ("", ""),
    ],
)
def test_an_email_is_one_mailbox_however_it_is_written(written: str, key: str) -> None:
    assert email_key(written) == key


def test_an_address_is_one_address_however_it_is_written() -> None:
    plain = address_key("12 St James's Square, London SW1Y 4JH")
    assert (
        plain
        == address_key("  12 ST JAMES'S  square ,\nLondon   sw1y 4jh ")
        == address_key("12 St. James's Square London SW1Y-4JH")
    )
    assert plain != address_key("14 St James's Square, London SW1Y 4JH")
