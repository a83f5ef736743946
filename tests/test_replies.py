"""What the customer is told follows the outcome (agent/replies.py): table tests of the pure composition."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from agent import replies
from agent.policy import Limits, decide, recheck
from steps.records import format_money
from tests.test_policy import NOW, order

#: Words that tell a customer someone is still looking at the refund: never in a message about a refusal.
REVIEWING = re.compile(r"review|approval|get back to you|our team|look into|pending", re.I)

USD, JPY = "USD", "JPY"


@pytest.mark.parametrize(("amount", "currency"), [("4200", USD), ("1234567", JPY), ("0.50", USD)])
def test_every_message_shows_the_amount_as_format_money_does(amount: str, currency: str) -> None:
    value = Decimal(amount)
    shown = format_money(value, currency)
    assert f"Your refund of {shown} has been approved and sent." in replies.paid(value, currency)
    assert f"we cannot refund {shown} on this order because" in replies.refused(value, currency, ["x"])
    assert f"we have decided not to refund {shown}" in replies.rejected_by_person(value, currency)
    assert f"could not confirm your refund of {shown} in time" in replies.expired(value, currency)


@pytest.mark.parametrize("nothing", [Decimal(0), Decimal("0.00"), None])
def test_a_refusal_with_no_amount_asked_or_refundable_never_reads_0_00(nothing: Decimal | None) -> None:
    """The customer named no amount and nothing was refundable (a disputed order): no 0.00 in their message."""
    text = replies.refused(nothing, USD, ["the order is disputed; refunds go through the dispute"])
    assert "we cannot refund anything on this order because a dispute" in text and "0.00" not in text


REFUSALS = [
    # policy's reason (agent/policy.py, evidence_policy.py) -> what the customer reads
    ("amount 12000.00 is above the absolute cap of 10000.00 USD", "more than we can refund for a single request"),
    ("the order does not exist", "we could not find this order"),
    ("the order disappeared", "we could not find this order"),
    ("the order is disputed; refunds go through the dispute", "a dispute about this payment is open"),
    ("the order is not paid", "has not been paid"),
    ("the order is outside the 30-day refund window", "past the period in which we can refund it"),
    ("the order is already fully refunded", "already been refunded in full"),
    ("currency EUR does not match the order's USD", "only be made in the order's currency"),
    ("amount 50.00 exceeds the refundable 10.00 USD", "more than what is left to refund"),
    ("re-check before paying: refuse: the order is already fully refunded", "already been refunded in full"),
    ("amount 80.00 USD is more than the 50.00 USD the customer asked for", "more than you asked for"),
    (
        "refund k-1 of this order is still open (deciding): a second claim on one order is never paid on its own",
        "an earlier refund request for this order is still open, and we answer it first",
    ),
    ("something policy never said before", "outside our refund policy"),
]


@pytest.mark.parametrize(("reason", "plain"), REFUSALS)
def test_a_refusal_says_why_in_plain_words_and_never_that_it_is_reviewed(reason: str, plain: str) -> None:
    text = replies.refused(Decimal("12000.00"), USD, [reason])
    assert plain in text
    assert not REVIEWING.search(text)
    for jargon in ("absolute cap", "auto-approve", "refundable", "re-check", "refuse:"):
        assert jargon not in text


LIMITS = Limits(auto_approve=Decimal("100.00"), absolute_cap=Decimal("10000.00"), window_days=30)


POLICY_REFUSALS = [
    # (what policy is given, the customer's words its refusal must come out as)
    ({"order": order(status="disputed"), "amount": "10.00"}, "a dispute about this payment is open"),
    ({"order": order(status="unpaid"), "amount": "10.00"}, "has not been paid"),
    ({"order": order(days=45), "amount": "10.00"}, "past the period in which we can refund it"),
    ({"order": order(refunded="500.00"), "amount": "10.00"}, "already been refunded in full"),
    ({"order": order(), "amount": "10.00", "currency": "EUR"}, "only be made in the order's currency"),
    ({"order": order(refunded="490.00"), "amount": "50.00"}, "more than what is left to refund"),
    ({"order": order(captured="20000.00"), "amount": "12000.00"}, "more than we can refund for a single request"),
    ({"order": order(), "amount": "10.005"}, "more decimal places than its currency allows"),
    ({"order": order(currency="KWD"), "amount": "10.005", "currency": "KWD"}, "cannot be paid out exactly"),
    ({"order": order(), "amount": "80.00", "requested": "50.00", "recheck": True}, "more than you asked for"),
]


@pytest.mark.parametrize(("given", "plain"), POLICY_REFUSALS)
def test_each_refusal_policy_gives_reads_in_its_own_plain_words(given: dict[str, Any], plain: str) -> None:
    """Driven by policy itself, so a reworded reason fails here instead of falling back to the general sentence."""
    judge = recheck if given.get("recheck") else decide
    requested = Decimal(given["requested"]) if "requested" in given else None
    verdict = judge(
        amount=Decimal(given["amount"]),
        currency=given.get("currency", given["order"].currency),
        order=given["order"],
        as_of=NOW,
        limits=LIMITS,
        requested=requested,
    )
    assert verdict.kind == "refuse"
    said = replies.plain_reasons(verdict.reasons)
    assert plain in said[0], (verdict.reasons, said)
    assert "it is outside our refund policy" not in said


def test_a_refusal_names_each_plain_reason_once() -> None:
    reasons = ["the order is not paid", "the order is not paid", "amount 1 exceeds the refundable 0 USD"]
    assert replies.plain_reasons(reasons) == [
        "this order has not been paid, so there is nothing to refund",
        "the amount is more than what is left to refund on this order",
    ]
    assert replies.plain_reasons([]) == ["it is outside our refund policy"]


@pytest.mark.parametrize(
    ("due", "shown"),
    [
        (datetime(2026, 12, 6, 14, 5, 0, tzinfo=UTC), "by 6 Dec 2026 14:05 UTC"),
        (datetime(2026, 12, 6, 14, 5, 0, 1, tzinfo=UTC), "by 6 Dec 2026 14:06 UTC"),  # never a minute early
        (datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC), "by 1 Jan 2027 00:00 UTC"),
        (datetime(2026, 12, 6, 9, 5, tzinfo=timezone(timedelta(hours=-5))), "by 6 Dec 2026 14:05 UTC"),
    ],
)
def test_a_parked_refund_is_told_a_person_confirms_it_and_by_when_it_hears_again(due: datetime, shown: str) -> None:
    text = replies.waiting(Decimal("4200.00"), USD, due)
    assert "4,200.00 USD" in text and "needs to confirm it" in text
    assert f"you will hear from us again {shown}." in text
    assert "cannot refund" not in text and "has been approved and sent" not in text


def test_a_refund_parked_with_the_customers_answer_tells_them_a_person_now_reviews_it() -> None:
    text = replies.waiting(Decimal("42.00"), USD, datetime(2026, 12, 6, 14, 5, tzinfo=UTC), answered=True)
    assert text.startswith("Thank you for your answer. A member of our team now reviews your request")
    assert "42.00 USD" in text and "you will hear from us again by 6 Dec 2026 14:05 UTC." in text
    assert "has been approved and sent" not in text and "cannot refund" not in text


@pytest.mark.parametrize(
    "text", [replies.rejected_by_person(Decimal(5), USD), replies.expired(Decimal(5), USD)], ids=["rejected", "expired"]
)
def test_a_person_s_no_and_an_expiry_never_say_it_is_reviewed(text: str) -> None:
    assert not REVIEWING.search(text)


DRAFTS = [
    # draft, amount paid, sent as written?
    ("Good news: we have approved a refund of 42.00 USD. It will reach your card in 5-10 days.", "42.00", True),
    ("Your refund of $4,200.00 has been sent to your card.", "4200.00", True),
    ("Su reembolso de 1.250,00 EUR ha sido reembolsado.", "1250.00", True),
    ("Your refund of 42.00 USD needs a quick review by our team; we will get back to you.", "42.00", False),
    ("We have approved a refund of 50.00 USD.", "42.00", False),  # another amount than the one paid
    ("We have received your request for 42.00 USD.", "42.00", False),  # says nothing of the money being sent
    ("Your refund of 42.00 USD is pending approval.", "42.00", False),
    ("Your refund of 42.00 USD has been sent for approval by our team.", "42.00", False),  # says sent, means asked
    ("We have approved a refund of 42.00 USD; a colleague will review it first.", "42.00", False),
    ("Refund sent.", "42.00", False),  # no amount
    ("", "42.00", False),
]

#: Drafts for a refund of 42.00 USD paid at once: every amount a draft names must be the one paid. A number is an
#: amount however it is written; ids, dates, times and durations are not; a percentage is never sent (a share of
#: what, no one can check).
OTHER_AMOUNTS = [
    ("We have refunded 42.00 USD now, and a further 958.00 USD is on its way.", False),
    ("We have refunded 42.00 USD now, and a further 958 is on its way.", False),
    ("We have refunded $42.00 now; $958 more will reach your card.", False),
    ("We have refunded USD 42 now and USD 958 will follow.", False),
    ("Wir haben 42,00 USD erstattet, weitere 958,00 USD folgen.", False),
    ("We have refunded 42.00 USD, and 1,000.00 USD more is on its way.", False),
    ("We have refunded 42.00 USD, and 1.000,00 USD more is on its way.", False),
    ("We have refunded 42.00 USD, and 1\u202f000,00 USD more is on its way.", False),
    ("We have refunded 42.00 USD, 100% of your order.", False),  # a percentage: not checkable, not sent
    ("We have refunded 42.00 USD and 10 % extra for the trouble.", False),
    ("We have refunded 42.00 USD and 42% more is on its way.", False),  # a share, even one that reads 42
    ("We have refunded 42.00 USD (42.00 USD in all).", True),  # the same amount twice
    ("We have refunded $42 for order ord_1001; it will reach your card in 5-10 business days.", True),
    ("We have refunded 42.00 USD for order #1001 on 2026-03-01 at 14:30.", True),
    ("We have refunded 42.00 USD on March 3, 2026; expect it within 5 to 10 days.", True),
    ("We have refunded 42.00 USD on 3 March 2026; expect it within 10 working days.", True),
    ("Wir haben 42,00 USD erstattet; das Geld ist in 5-10 Werktagen auf Ihrer Karte.", True),
    ("We have refunded 42.00 USD; the other 2 items will ship separately.", False),  # a bare number: could be money
]


@pytest.mark.parametrize(("draft", "fits"), OTHER_AMOUNTS)
def test_a_draft_naming_any_amount_but_the_one_paid_is_not_sent(draft: str, fits: bool) -> None:
    paid = Decimal("42.00")
    assert replies.draft_fits(draft, paid) is fits
    assert replies.paid_at_once(draft, paid, USD) == (draft if fits else replies.paid(paid, USD))


@pytest.mark.parametrize(("draft", "amount", "fits"), DRAFTS)
def test_the_models_draft_is_sent_only_when_it_names_the_amount_paid_and_promises_no_review(
    draft: str, amount: str, fits: bool
) -> None:
    value = Decimal(amount)
    assert replies.draft_fits(draft, value) is fits
    sent = replies.paid_at_once(draft, value, USD)
    assert sent == (draft if fits else replies.paid(value, USD))
