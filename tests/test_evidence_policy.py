# ruff: noqa: E501  (the table reads one row per rule)
"""Policy on evidence is pure: a table of claims, recorded look-ups and recent refunds against the verdict they get.

Every rule of agent/evidence_policy.py and the serial-claimant rule of agent/policy.py has a row whose verdict
changes when the rule is removed: `python tests/mutation/remove_rules.py` removes each one in turn and checks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from agent.domain import ClaimCategory
from agent.policy import Claim, Limits, decide
from steps.evidence import (
    Dispute,
    Evidence,
    FraudWarning,
    ReturnLine,
    ReturnReceipt,
    RiskSignals,
    Tracking,
    TrackingEvent,
)
from steps.records import Order, PastRefund

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
    amount_captured=Decimal("130.00"),
    amount_refunded=Decimal(0),
    status="paid",
    paid_at=NOW - timedelta(days=10),
    charge_id="ch_x",
    items=["Coffee grinder", "Kettle"],
    carrier="UPS",
    tracking_code="1Z0001",
)


def tracking(status: str, **kwargs: Any) -> Tracking:
    event = TrackingEvent(status=status, message=status, at=NOW - timedelta(days=1), place="Austin TX US")  # type: ignore[arg-type]
    return Tracking(carrier="UPS", tracking_code="1Z0001", status=status, events=[event], **kwargs)  # type: ignore[arg-type]


def receipt(status: str, lines: list[ReturnLine] | None = None, **kwargs: Any) -> ReturnReceipt:
    return ReturnReceipt(order_id="ord_x", rma_id="RMA-1", status=status, currency="USD", lines=lines or [], **kwargs)  # type: ignore[arg-type]


GRINDER = ReturnLine(description="Coffee grinder", quantity=1, amount=Decimal("80.00"), received=True, condition="new")
KETTLE = ReturnLine(description="Kettle", quantity=1, amount=Decimal("50.00"), received=False)
DELIVERED_SIGNED = tracking("delivered", delivered_at=NOW - timedelta(days=2), proof="signature", signed_by="J. DOE")
IN_TRANSIT = tracking("in_transit", est_delivery=NOW + timedelta(days=2))
LATE = tracking("in_transit", est_delivery=NOW - timedelta(days=3))
DISPUTE = Dispute(
    dispute_id="dp_1",
    status="needs_response",
    reason="product_not_received",
    amount=Decimal("130.00"),
    currency="USD",
    created=NOW,
)
WON = DISPUTE.model_copy(update={"status": "won"})
EFW = FraudWarning(warning_id="issfr_1", fraud_type="made_with_stolen_card", actionable=True, created=NOW)


def past(n: int, *, amount: str = "10.00", status: str = "completed", days: int = 3) -> list[PastRefund]:
    return [
        PastRefund(
            refund_id=f"r{i}",
            order_id=f"ord_{i}",
            amount=Decimal(amount),
            currency="USD",
            status=status,
            created_at=NOW - timedelta(days=days),
        )
        for i in range(n)
    ]


ROWS: list[tuple[str, ClaimCategory, Evidence, list[PastRefund], str, str, str]] = [
    # (what, category, evidence, history, amount proposed, expected kind, expected amount)
    ("a plain claim with no evidence is judged on money alone", "damaged", Evidence(), [], "42.00", "auto_approve", "42.00"),
    ("never arrived, carrier says delivered and signed: a person", "not_received", Evidence(tracking=DELIVERED_SIGNED), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, delivered with a photo: a person", "not_received", Evidence(tracking=tracking("delivered", proof="photo")), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, in transit within its ETA: nothing now", "not_received", Evidence(tracking=IN_TRANSIT), [], "42.00", "refuse", "42.00"),
    ("never arrived, past its ETA: a person", "not_received", Evidence(tracking=LATE), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, in transit with no ETA: a person", "not_received", Evidence(tracking=tracking("in_transit")), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, returned to sender: refunded", "not_received", Evidence(tracking=tracking("return_to_sender")), [], "42.00", "auto_approve", "42.00"),
    ("never arrived, delivery failed: refunded", "not_received", Evidence(tracking=tracking("failure")), [], "42.00", "auto_approve", "42.00"),
    ("never arrived, carrier knows no such parcel: a person", "not_received", Evidence(tracking=tracking("unknown", found=False)), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, tracking never looked up: a person", "not_received", Evidence(), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, tracking could not be read: a person", "not_received", Evidence(failed={"tracking": "carrier 503"}), [], "42.00", "needs_approval", "42.00"),
    ("returned and received: the received lines are refunded", "returned", Evidence(returns=receipt("received", [GRINDER, KETTLE])), [], "130.00", "auto_approve", "80.00"),
    ("returned and inspected, asked less than received: what was asked", "returned", Evidence(returns=receipt("inspected", [GRINDER, KETTLE])), [], "60.00", "auto_approve", "60.00"),
    ("returned, a received line inspected damaged: a person", "returned", Evidence(returns=receipt("inspected", [GRINDER.model_copy(update={"condition": "damaged"})])), [], "80.00", "needs_approval", "80.00"),
    ("returned, nothing received yet: nothing now", "returned", Evidence(returns=receipt("received", [KETTLE])), [], "50.00", "refuse", "50.00"),
    ("returned, the label was never scanned: nothing now", "returned", Evidence(returns=receipt("label_created", label_created_at=NOW - timedelta(days=20))), [], "55.00", "refuse", "55.00"),
    ("returned, the return is on its way: nothing now", "returned", Evidence(returns=receipt("in_transit")), [], "55.00", "refuse", "55.00"),
    ("returned, no return was ever opened: nothing now", "returned", Evidence(returns=receipt("none")), [], "55.00", "refuse", "55.00"),
    ("changed their mind, return received: refunded", "changed_mind", Evidence(returns=receipt("received", [GRINDER])), [], "80.00", "auto_approve", "80.00"),
    ("changed their mind, return never looked up: a person", "changed_mind", Evidence(), [], "42.00", "needs_approval", "42.00"),
    ("open dispute on the charge: refused, the dispute decides", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", disputes=[DISPUTE])), [], "42.00", "refuse", "42.00"),
    ("a dispute the merchant won does not block", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", disputes=[WON])), [], "42.00", "auto_approve", "42.00"),
    ("a charge they do not recognise, risk never looked up: a person", "duplicate_charge", Evidence(), [], "42.00", "needs_approval", "42.00"),
    ("a charge they do not recognise, risk could not be read: a person", "duplicate_charge", Evidence(failed={"risk": "stripe 503"}), [], "42.00", "needs_approval", "42.00"),
    ("a charge they do not recognise, no dispute or warning: refunded", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x")), [], "42.00", "auto_approve", "42.00"),
    ("early fraud warning: refunded, and flagged", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])), [], "42.00", "auto_approve", "42.00"),
    ("a fourth refund in 30 days: a person, even under the limit", "damaged", Evidence(), past(3), "5.00", "needs_approval", "5.00"),
    ("a third refund in 30 days is paid", "damaged", Evidence(), past(2), "5.00", "auto_approve", "5.00"),
    ("refunds older than the window do not count", "damaged", Evidence(), past(5, days=40), "5.00", "auto_approve", "5.00"),
    ("refused earlier refunds do not count", "damaged", Evidence(), past(5, status="rejected"), "5.00", "auto_approve", "5.00"),
    ("more money than allowed in 30 days: a person", "damaged", Evidence(), past(2, amount="90.00"), "30.00", "needs_approval", "30.00"),
    ("the evidence never lifts a refusal: over the refundable stays refused", "not_received", Evidence(tracking=DELIVERED_SIGNED), [], "130.01", "refuse", "130.01"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("category", "evidence", "history", "amount", "kind", "paid"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_evidence_rules_decide(
    category: ClaimCategory, evidence: Evidence, history: list[PastRefund], amount: str, kind: str, paid: str
) -> None:
    claim = Claim(category=category, evidence=evidence, history=history, refund_id="this")
    verdict = decide(amount=Decimal(amount), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert (verdict.kind, verdict.amount) == (kind, Decimal(paid)), verdict.reasons


REASONS: list[tuple[ClaimCategory, Evidence, str]] = [
    ("not_received", Evidence(failed={"tracking": "carrier 503"}), "tracking could not be read (carrier 503)"),
    ("not_received", Evidence(tracking=tracking("unknown", found=False)), "no usable record of UPS 1Z0001"),
    ("returned", Evidence(returns=receipt("none")), "no return was opened"),
    ("returned", Evidence(returns=receipt("in_transit")), "the return RMA-1 is on its way to the warehouse"),
    ("returned", Evidence(returns=receipt("label_created")), "was created and the parcel was never scanned"),
]


@pytest.mark.parametrize(("category", "evidence", "said"), REASONS, ids=[r[2] for r in REASONS])
def test_the_verdict_says_what_the_evidence_showed(category: ClaimCategory, evidence: Evidence, said: str) -> None:
    claim = Claim(category=category, evidence=evidence)
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert any(said in reason for reason in verdict.reasons), verdict.reasons


def test_in_transit_tells_the_customer_the_expected_date() -> None:
    claim = Claim(category="not_received", evidence=Evidence(tracking=IN_TRANSIT))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.customer_note is not None and "2026-11-03" in verdict.customer_note
    assert "1Z0001" in verdict.customer_note


def test_a_never_scanned_return_tells_the_customer_what_to_do() -> None:
    claim = Claim(category="returned", evidence=Evidence(returns=receipt("label_created")))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.customer_note is not None and "RMA-1" in verdict.customer_note and "Drop" in verdict.customer_note


def test_delivered_with_signature_names_the_signer_for_the_approver() -> None:
    claim = Claim(category="not_received", evidence=Evidence(tracking=DELIVERED_SIGNED))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert any("signed by J. DOE" in reason for reason in verdict.reasons)


def test_early_fraud_warning_is_flagged_and_noted() -> None:
    claim = Claim(category="other", evidence=Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.flags == ("early_fraud_warning",) and any("issfr_1" in f for f in verdict.findings)


def test_an_order_never_shipped_cannot_be_checked_and_goes_to_a_person() -> None:
    unshipped = ORDER.model_copy(update={"tracking_code": "", "carrier": ""})
    claim = Claim(category="not_received")
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=unshipped, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind == "needs_approval" and "no tracking number" in verdict.reasons[0]


def test_this_refund_is_not_counted_in_its_own_history() -> None:
    this = PastRefund(
        refund_id="this", order_id="ord_x", amount=Decimal(5), currency="USD", status="deciding", created_at=NOW
    )
    history = [*past(2), this]
    claim = Claim(category="other", history=history, refund_id="this")
    verdict = decide(amount=Decimal("5.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind == "auto_approve"


def test_without_a_claim_policy_is_the_money_rules_alone() -> None:
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS)
    assert verdict.kind == "auto_approve" and verdict.findings == () and verdict.flags == ()


def test_a_proposal_above_the_request_still_goes_to_a_person_when_the_return_lowers_it() -> None:
    claim = Claim(category="returned", evidence=Evidence(returns=receipt("received", [GRINDER, KETTLE])))
    verdict = decide(
        amount=Decimal("99999.00"),
        currency="USD",
        order=ORDER,
        as_of=NOW,
        limits=LIMITS,
        requested=Decimal("100.00"),
        claim=claim,
    )
    assert (verdict.kind, verdict.amount) == ("needs_approval", Decimal("80.00"))
    assert "more than the 100.00 USD the customer asked for" in verdict.reasons[0]
