"""Policy is pure: a table of orders, amounts and times against the verdict they must get."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agent.policy import Limits, blockers, days_since_payment, decide, recheck, refundable, within_window
from steps.records import Order

NOW = datetime(2026, 11, 1, tzinfo=UTC)
LIMITS = Limits(
    auto_approve=Decimal("100.00"),
    absolute_cap=Decimal("10000.00"),
    window_days=60,
    auto_approve_by_currency={"JPY": Decimal("15000")},
    absolute_cap_by_currency={"JPY": Decimal("1500000")},
)


def order(
    *,
    captured: str = "500.00",
    refunded: str = "0",
    status: str = "paid",
    days: int = 5,
    currency: str = "USD",
) -> Order:
    return Order(
        order_id="ord_x",
        customer_id="cus_x",
        customer_name="X",
        currency=currency,
        amount_captured=Decimal(captured),
        amount_refunded=Decimal(refunded),
        status=status,  # type: ignore[arg-type]
        paid_at=NOW - timedelta(days=days),
        charge_id="ch_x",
        items=["thing"],
    )


CASES = [
    # (description, order kwargs, amount, currency, expected kind)
    ("small refund is paid at once", {}, "42.00", "USD", "auto_approve"),
    ("exactly the auto-approve limit is paid at once", {}, "100.00", "USD", "auto_approve"),
    ("one cent over the limit needs a person", {}, "100.01", "USD", "needs_approval"),
    (
        "full refund of a big order needs a person",
        {"captured": "4200.00"},
        "4200.00",
        "USD",
        "needs_approval",
    ),
    ("above the absolute cap is refused", {"captured": "12000.00"}, "10000.01", "USD", "refuse"),
    ("exactly the absolute cap needs a person", {"captured": "12000.00"}, "10000.00", "USD", "needs_approval"),
    ("more than captured is refused", {}, "500.01", "USD", "refuse"),
    ("more than captured minus refunded is refused", {"refunded": "450.00"}, "60.00", "USD", "refuse"),
    (
        "the rest of a partly refunded order is allowed",
        {"refunded": "450.00"},
        "50.00",
        "USD",
        "auto_approve",
    ),
    ("disputed orders are refused", {"status": "disputed"}, "10.00", "USD", "refuse"),
    ("unpaid orders are refused", {"status": "unpaid"}, "10.00", "USD", "refuse"),
    ("outside the window is refused", {"days": 61}, "10.00", "USD", "refuse"),
    ("last day of the window is allowed", {"days": 60}, "10.00", "USD", "auto_approve"),
    ("wrong currency is refused", {}, "10.00", "EUR", "refuse"),
    ("zero is refused", {}, "0", "USD", "refuse"),
    ("sub-cent amounts are refused", {}, "10.001", "USD", "refuse"),
    ("fractional yen is refused", {"currency": "JPY", "captured": "20000"}, "100.5", "JPY", "refuse"),
    (
        "per-currency limit: 15000 JPY is paid at once",
        {"currency": "JPY", "captured": "20000"},
        "15000",
        "JPY",
        "auto_approve",
    ),
    (
        "per-currency limit: 15001 JPY needs a person",
        {"currency": "JPY", "captured": "20000"},
        "15001",
        "JPY",
        "needs_approval",
    ),
    ("fully refunded order is refused", {"refunded": "500.00"}, "1.00", "USD", "refuse"),
]


@pytest.mark.parametrize(("description", "kwargs", "amount", "currency", "expected"), CASES, ids=[c[0] for c in CASES])
def test_policy_table(description: str, kwargs: dict[str, str], amount: str, currency: str, expected: str) -> None:
    verdict = decide(amount=Decimal(amount), currency=currency, order=order(**kwargs), as_of=NOW, limits=LIMITS)  # type: ignore[arg-type]
    assert verdict.kind == expected, verdict.reasons
    assert (verdict.kind == "refuse") == bool(verdict.reasons) or verdict.kind == "needs_approval"


def test_refundable_is_zero_when_disputed_or_out_of_window() -> None:
    assert refundable(order(status="disputed"), NOW, 60) == 0
    assert refundable(order(status="unpaid"), NOW, 60) == 0
    assert refundable(order(days=90), NOW, 60) == 0
    assert refundable(order(refunded="120.00"), NOW, 60) == Decimal("380.00")


def test_refused_verdict_says_why() -> None:
    verdict = decide(amount=Decimal("10.00"), currency="USD", order=order(status="disputed"), as_of=NOW, limits=LIMITS)
    assert "disputed" in verdict.summary


@pytest.mark.parametrize(
    ("since_payment", "inside"),
    [
        (timedelta(0), True),
        (timedelta(days=59, hours=23), True),
        (timedelta(days=60), True),
        (timedelta(days=60, hours=23, minutes=59, seconds=59), True),
        (timedelta(days=61), False),
        (timedelta(days=61, seconds=1), False),
        (timedelta(days=200), False),
    ],
    ids=str,
)
def test_the_window_runs_through_the_whole_of_its_last_day(since_payment: timedelta, inside: bool) -> None:
    paid = order().model_copy(update={"paid_at": NOW - since_payment})
    verdict = decide(amount=Decimal("10.00"), currency="USD", order=paid, as_of=NOW, limits=LIMITS)
    assert within_window(days_since_payment(NOW - since_payment, NOW), 60) is inside
    assert verdict.kind == ("auto_approve" if inside else "refuse"), verdict.reasons
    assert refundable(paid, NOW, 60) == (Decimal("500.00") if inside else 0)
    assert blockers(paid, NOW, 60) == ([] if inside else ["the order is outside the 60-day refund window"])


def test_days_since_payment_counts_whole_days() -> None:
    assert days_since_payment(NOW - timedelta(days=60, hours=23), NOW) == 60
    assert days_since_payment(NOW - timedelta(hours=23), NOW) == 0
    assert (within_window(60, 60), within_window(61, 60), within_window(0, 0), within_window(1, 0)) == (
        True,
        False,
        True,
        False,
    )


REFUSALS = [
    # (description, order kwargs, amount, currency, the reasons policy gives, in order)
    ("disputed", {"status": "disputed"}, "10.00", "USD", ["the order is disputed; refunds go through the dispute"]),
    ("unpaid", {"status": "unpaid"}, "10.00", "USD", ["the order is not paid"]),
    ("out of window", {"days": 61}, "10.00", "USD", ["the order is outside the 60-day refund window"]),
    ("fully refunded", {"refunded": "500.00"}, "1.00", "USD", ["the order is already fully refunded"]),
    ("refunded beyond capture", {"refunded": "510.00"}, "1.00", "USD", ["the order is already fully refunded"]),
    ("wrong currency", {}, "10.00", "EUR", ["currency EUR does not match the order's USD"]),
    (
        "wrong currency, the other way",
        {"currency": "EUR"},
        "10.00",
        "USD",
        ["currency USD does not match the order's EUR"],
    ),
    ("nothing proposed", {}, "0", "USD", ["no refund amount was proposed"]),
    ("negative", {}, "-5.00", "USD", ["no refund amount was proposed"]),
    ("sub-cent", {}, "10.001", "USD", ["amount 10.001 is finer than USD allows: USD has 2 decimal places"]),
    ("more than left", {"refunded": "450.00"}, "60.00", "USD", ["amount 60.00 USD exceeds the refundable 50.00 USD"]),
    (
        "above the cap and more than captured",
        {},
        "10000.01",
        "USD",
        [
            "amount 10,000.01 USD exceeds the refundable 500.00 USD",
            "amount 10,000.01 USD is above the absolute cap of 10,000.00 USD",
        ],
    ),
    (
        "disputed and above the cap: no room reason once another rule refused",
        {"status": "disputed"},
        "10000.01",
        "USD",
        [
            "the order is disputed; refunds go through the dispute",
            "amount 10,000.01 USD is above the absolute cap of 10,000.00 USD",
        ],
    ),
]


@pytest.mark.parametrize(
    ("description", "kwargs", "amount", "currency", "reasons"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_a_refusal_names_the_rules_that_refused_it(
    description: str, kwargs: dict[str, str], amount: str, currency: str, reasons: list[str]
) -> None:
    verdict = decide(amount=Decimal(amount), currency=currency, order=order(**kwargs), as_of=NOW, limits=LIMITS)  # type: ignore[arg-type]
    assert verdict.kind == "refuse"
    assert list(verdict.reasons) == reasons


def test_a_currency_equal_to_the_orders_is_accepted_whatever_string_object_carries_it() -> None:
    currency = "".join(["U", "SD"])  # equal to "USD", but not the same object
    verdict = decide(amount=Decimal("10.00"), currency=currency, order=order(), as_of=NOW, limits=LIMITS)
    assert verdict.kind == "auto_approve", verdict.reasons


def test_a_verdict_carries_the_amount_currency_and_what_was_refundable() -> None:
    verdict = decide(amount=Decimal("150.00"), currency="USD", order=order(refunded="100.00"), as_of=NOW, limits=LIMITS)
    assert (verdict.kind, verdict.amount, verdict.currency, verdict.refundable) == (
        "needs_approval",
        Decimal("150.00"),
        "USD",
        Decimal("400.00"),
    )
    assert verdict.reasons == ("amount is above the auto-approve limit of 100.00 USD",)
    paid = decide(
        amount=Decimal("15000"), currency="JPY", order=order(currency="JPY", captured="20000"), as_of=NOW, limits=LIMITS
    )
    assert (paid.kind, paid.refundable, paid.reasons) == ("auto_approve", Decimal("20000"), ())


def test_limits_cannot_be_changed_once_built() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        LIMITS.auto_approve = Decimal("1000000")  # type: ignore[misc]


OVER = "the agent proposed {proposed}, more than the {asked} the customer asked for"
BOUNDED = [
    # (description, order kwargs, proposed, requested, currency, expected kind, amount that may be paid, reasons)
    (
        "no amount named: bounded by what is refundable, as before",
        {},
        "42.00",
        None,
        "USD",
        "auto_approve",
        "42.00",
        [],
    ),
    ("the amount asked for is paid at once", {}, "1.00", "1.00", "USD", "auto_approve", "1.00", []),
    ("less than asked is the model's to propose", {}, "30.00", "50.00", "USD", "auto_approve", "30.00", []),
    (
        "more than asked goes to a person for what was asked",
        {},
        "42.00",
        "1.00",
        "USD",
        "needs_approval",
        "1.00",
        [OVER.format(proposed="42.00 USD", asked="1.00 USD")],
    ),
    (
        "one cent more than asked goes to a person too",
        {},
        "1.01",
        "1.00",
        "USD",
        "needs_approval",
        "1.00",
        [OVER.format(proposed="1.01 USD", asked="1.00 USD")],
    ),
    (
        "the whole balance instead of a small amount, on a big order",
        {"captured": "4200.00"},
        "4200.00",
        "1.00",
        "USD",
        "needs_approval",
        "1.00",
        [OVER.format(proposed="4,200.00 USD", asked="1.00 USD")],
    ),
    (
        "more than asked, and what was asked is above the auto-approve limit",
        {"captured": "4200.00"},
        "4200.00",
        "150.00",
        "USD",
        "needs_approval",
        "150.00",
        [
            OVER.format(proposed="4,200.00 USD", asked="150.00 USD"),
            "amount is above the auto-approve limit of 100.00 USD",
        ],
    ),
    (
        "more than asked, and what was asked is more than is refundable: refused",
        {"refunded": "450.00"},
        "100.00",
        "60.00",
        "USD",
        "refuse",
        "60.00",
        [OVER.format(proposed="100.00 USD", asked="60.00 USD"), "amount 60.00 USD exceeds the refundable 50.00 USD"],
    ),
    (
        "more than asked, and what was asked is above the cap: refused",
        {"captured": "12000.00"},
        "12000.00",
        "10000.01",
        "USD",
        "refuse",
        "10000.01",
        [
            OVER.format(proposed="12,000.00 USD", asked="10,000.01 USD"),
            "amount 10,000.01 USD is above the absolute cap of 10,000.00 USD",
        ],
    ),
    (
        "more than asked on a disputed order: refused",
        {"status": "disputed"},
        "42.00",
        "1.00",
        "USD",
        "refuse",
        "1.00",
        [OVER.format(proposed="42.00 USD", asked="1.00 USD"), "the order is disputed; refunds go through the dispute"],
    ),
    (
        "more than asked in another currency: refused",
        {},
        "42.00",
        "1.00",
        "EUR",
        "refuse",
        "1.00",
        [OVER.format(proposed="42.00 EUR", asked="1.00 USD"), "currency EUR does not match the order's USD"],
    ),
    (
        "a sub-cent proposal above the request is shown as proposed",
        {},
        "1.005",
        "1.00",
        "USD",
        "needs_approval",
        "1.00",
        [OVER.format(proposed="1.005 USD", asked="1.00 USD")],
    ),
    (
        "yen: the whole order instead of 100",
        {"currency": "JPY", "captured": "15000"},
        "15000",
        "100",
        "JPY",
        "needs_approval",
        "100",
        [OVER.format(proposed="15,000 JPY", asked="100 JPY")],
    ),
    (
        "a refused proposal below the request stays refused",
        {"status": "unpaid"},
        "1.00",
        "5.00",
        "USD",
        "refuse",
        "1.00",
        ["the order is not paid"],
    ),
]


@pytest.mark.parametrize(
    ("description", "kwargs", "proposed", "requested", "currency", "kind", "amount", "reasons"),
    BOUNDED,
    ids=[b[0] for b in BOUNDED],
)
def test_the_requested_amount_bounds_what_may_be_paid(
    description: str,
    kwargs: dict[str, str],
    proposed: str,
    requested: str | None,
    currency: str,
    kind: str,
    amount: str,
    reasons: list[str],
) -> None:
    asked = None if requested is None else Decimal(requested)
    placed = order(**kwargs)  # type: ignore[arg-type]
    verdict = decide(
        amount=Decimal(proposed), currency=currency, order=placed, as_of=NOW, limits=LIMITS, requested=asked
    )
    assert (verdict.kind, verdict.amount, list(verdict.reasons)) == (kind, Decimal(amount), reasons)
    assert verdict.requested == asked


RECHECKS = [
    # (description, amount about to be paid, requested, expected kind, reasons)
    ("the amount asked for passes", "1.00", "1.00", "auto_approve", []),
    ("less than asked passes", "0.50", "1.00", "auto_approve", []),
    ("no amount named: the usual rules", "42.00", None, "auto_approve", []),
    ("one cent more than asked is refused", "1.01", "1.00", "refuse",
     ["amount 1.01 USD is more than the 1.00 USD the customer asked for"]),
    ("an approved amount above the request is refused", "150.00", "1.00", "refuse",
     ["amount 150.00 USD is more than the 1.00 USD the customer asked for"]),
    ("an approved amount within the request keeps the usual rules", "150.00", "150.00", "needs_approval",
     ["amount is above the auto-approve limit of 100.00 USD"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("description", "amount", "requested", "kind", "reasons"), RECHECKS, ids=[r[0] for r in RECHECKS]
)
def test_the_recheck_before_paying_never_pays_more_than_was_asked(
    description: str, amount: str, requested: str | None, kind: str, reasons: list[str]
) -> None:
    asked = None if requested is None else Decimal(requested)
    verdict = recheck(amount=Decimal(amount), currency="USD", order=order(), as_of=NOW, limits=LIMITS, requested=asked)
    assert (verdict.kind, list(verdict.reasons)) == (kind, reasons)


def test_the_recheck_keeps_the_usual_rules_within_the_request() -> None:
    verdict = recheck(
        amount=Decimal("1.00"), currency="USD", order=order(status="disputed"), as_of=NOW, limits=LIMITS,
        requested=Decimal("5.00"),
    )  # fmt: skip
    assert verdict.kind == "refuse" and verdict.reasons == ("the order is disputed; refunds go through the dispute",)
