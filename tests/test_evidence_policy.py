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

from agent.claim_reading import Read
from agent.domain import ClaimCategory
from agent.evidence_policy import ETA_GRACE
from agent.policy import Claim, Limits, decide, look_ups_wanted
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


CLEAN = RiskSignals(charge_id="ch_x")  # the charge's risk, read: no dispute, no fraud warning


def ev(**found: Any) -> Evidence:
    """Evidence whose charge risk was read and is clean, plus ``found`` (a paid-at-once refund needs the risk)."""
    return Evidence(**({"risk": CLEAN} | found))


ROWS: list[tuple[str, ClaimCategory, Evidence, list[PastRefund], str, str, str]] = [
    # (what, category, evidence, history, amount proposed, expected kind, expected amount)
    ("a plain claim with its charge read is judged on money alone", "other", ev(), [], "42.00", "auto_approve", "42.00"),
    ("a refund paid at once needs the charge's risk read: a person", "other", Evidence(), [], "42.00", "needs_approval", "42.00"),
    ("the charge's risk could not be read: a person", "other", Evidence(failed={"risk": "stripe 503"}), [], "42.00", "needs_approval", "42.00"),
    ("above the limit the risk is not needed: a person anyway", "other", Evidence(), [], "120.00", "needs_approval", "120.00"),
    ("damaged and delivered: paid", "damaged", ev(tracking=DELIVERED_SIGNED), [], "42.00", "auto_approve", "42.00"),
    ("damaged, tracking never looked up: a person", "damaged", ev(), [], "42.00", "needs_approval", "42.00"),
    ("damaged, but the parcel is in transit: a person", "damaged", ev(tracking=IN_TRANSIT), [], "42.00", "needs_approval", "42.00"),
    ("wrong item, but the parcel went back to the sender: a person", "wrong_item", ev(tracking=tracking("return_to_sender")), [], "42.00", "needs_approval", "42.00"),
    ("not as described, the carrier knows no such parcel: a person", "not_as_described", ev(tracking=tracking("unknown", found=False)), [], "42.00", "needs_approval", "42.00"),
    ("damaged, a return was received: counted as a fact, paid", "damaged", ev(tracking=DELIVERED_SIGNED, returns=receipt("received", [GRINDER])), [], "42.00", "auto_approve", "42.00"),
    ("changed their mind, the parcel is in transit: the return decides", "changed_mind", ev(tracking=IN_TRANSIT, returns=receipt("none")), [], "42.00", "refuse", "42.00"),
    ("never arrived, carrier says delivered and signed: a person", "not_received", ev(tracking=DELIVERED_SIGNED), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, delivered with a photo: a person", "not_received", ev(tracking=tracking("delivered", proof="photo")), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, in transit within its ETA: nothing now", "not_received", ev(tracking=IN_TRANSIT), [], "42.00", "refuse", "42.00"),
    ("never arrived, past its ETA: a person", "not_received", ev(tracking=LATE), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, in transit with no ETA: a person", "not_received", ev(tracking=tracking("in_transit")), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, returned to sender: refunded", "not_received", ev(tracking=tracking("return_to_sender")), [], "42.00", "auto_approve", "42.00"),
    ("never arrived, delivery failed: refunded", "not_received", ev(tracking=tracking("failure")), [], "42.00", "auto_approve", "42.00"),
    ("never arrived, carrier knows no such parcel: a person", "not_received", ev(tracking=tracking("unknown", found=False)), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, tracking never looked up: a person", "not_received", ev(), [], "42.00", "needs_approval", "42.00"),
    ("never arrived, tracking could not be read: a person", "not_received", ev(failed={"tracking": "carrier 503"}), [], "42.00", "needs_approval", "42.00"),
    ("returned and received: the received lines are refunded", "returned", ev(returns=receipt("received", [GRINDER, KETTLE])), [], "130.00", "auto_approve", "80.00"),
    ("returned and inspected, asked less than received: what was asked", "returned", ev(returns=receipt("inspected", [GRINDER, KETTLE])), [], "60.00", "auto_approve", "60.00"),
    ("returned, a received line inspected damaged: a person", "returned", ev(returns=receipt("inspected", [GRINDER.model_copy(update={"condition": "damaged"})])), [], "80.00", "needs_approval", "80.00"),
    ("returned, nothing received yet: nothing now", "returned", ev(returns=receipt("received", [KETTLE])), [], "50.00", "refuse", "50.00"),
    ("returned, the label was never scanned: nothing now", "returned", ev(returns=receipt("label_created", label_created_at=NOW - timedelta(days=20))), [], "55.00", "refuse", "55.00"),
    ("returned, the return is on its way: nothing now", "returned", ev(returns=receipt("in_transit")), [], "55.00", "refuse", "55.00"),
    ("returned, no return was ever opened: nothing now", "returned", ev(returns=receipt("none")), [], "55.00", "refuse", "55.00"),
    ("changed their mind, return received: refunded", "changed_mind", ev(returns=receipt("received", [GRINDER])), [], "80.00", "auto_approve", "80.00"),
    ("changed their mind, return never looked up: a person", "changed_mind", ev(), [], "42.00", "needs_approval", "42.00"),
    ("open dispute on the charge: refused, the dispute decides", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", disputes=[DISPUTE])), [], "42.00", "refuse", "42.00"),
    ("open dispute refuses a damaged claim too", "damaged", Evidence(tracking=DELIVERED_SIGNED, risk=RiskSignals(charge_id="ch_x", disputes=[DISPUTE])), [], "42.00", "refuse", "42.00"),
    ("a dispute the merchant won does not block", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", disputes=[WON])), [], "42.00", "auto_approve", "42.00"),
    ("a charge they do not recognise, risk never looked up: a person", "duplicate_charge", Evidence(), [], "42.00", "needs_approval", "42.00"),
    ("a charge they do not recognise, risk could not be read: a person", "duplicate_charge", Evidence(failed={"risk": "stripe 503"}), [], "42.00", "needs_approval", "42.00"),
    ("a charge they do not recognise, no dispute or warning: refunded", "duplicate_charge", ev(), [], "42.00", "auto_approve", "42.00"),
    ("early fraud warning: a person, and flagged", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])), [], "42.00", "needs_approval", "42.00"),
    ("early fraud warning on any claim: a person", "other", Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])), [], "42.00", "needs_approval", "42.00"),
    ("a fourth refund in 30 days: a person, even under the limit", "other", ev(), past(3), "5.00", "needs_approval", "5.00"),
    ("a third refund in 30 days is paid", "other", ev(), past(2), "5.00", "auto_approve", "5.00"),
    ("refunds older than the window do not count", "other", ev(), past(5, days=40), "5.00", "auto_approve", "5.00"),
    ("refused earlier refunds do not count", "other", ev(), past(5, status="rejected"), "5.00", "auto_approve", "5.00"),
    ("more money than allowed in 30 days: a person", "other", ev(), past(2, amount="90.00"), "30.00", "needs_approval", "30.00"),
    ("the evidence never lifts a refusal: over the refundable stays refused", "not_received", ev(tracking=DELIVERED_SIGNED), [], "130.01", "refuse", "130.01"),
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


def test_early_fraud_warning_goes_to_a_person_flagged_and_noted() -> None:
    claim = Claim(category="other", evidence=Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.flags == ("early_fraud_warning",) and any("issfr_1" in f for f in verdict.findings)
    assert verdict.kind == "needs_approval" and any("reported the charge as fraud" in r for r in verdict.reasons)


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
    claim = Claim(category="other", evidence=ev(), history=history, refund_id="this")
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


def test_a_parcel_inside_its_grace_after_the_expected_date_is_still_on_its_way() -> None:
    """ETA_GRACE is added to the expected date: a parcel a little late is waited for, one later than the grace is
    a person's (a grace subtracted would send both to a person)."""
    assert timedelta(0) < ETA_GRACE
    inside = tracking("in_transit", est_delivery=NOW - ETA_GRACE / 2)
    beyond = tracking("in_transit", est_delivery=NOW - ETA_GRACE - timedelta(hours=1))
    kinds = []
    for parcel in (inside, beyond):
        claim = Claim(category="not_received", evidence=ev(tracking=parcel))
        kinds.append(
            decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim).kind
        )
    assert kinds == ["refuse", "needs_approval"]


WORDS: list[tuple[str, ClaimCategory, frozenset[Read], Evidence, str]] = [
    # (what, the agent's category, what the words say, evidence, expected kind)
    ("the agent files 'never arrived' as damaged: a person", "damaged", frozenset({"not_received"}), ev(tracking=tracking("delivered", proof="photo")), "needs_approval"),
    ("the agent files 'charged twice' as damaged, charge clean: still a person", "damaged", frozenset({"duplicate_charge"}), ev(tracking=DELIVERED_SIGNED), "needs_approval"),
    ("the agent and the words agree: paid", "damaged", frozenset({"damaged"}), ev(tracking=DELIVERED_SIGNED), "auto_approve"),
    ("the agent names one of the words' two claims: both judged", "damaged", frozenset({"damaged", "returned"}), ev(tracking=DELIVERED_SIGNED, returns=receipt("none")), "refuse"),
    ("the agent names none ('other'): the words' claim is judged", "other", frozenset({"not_received"}), ev(tracking=IN_TRANSIT), "refuse"),
    ("words the reader does not know: the agent's category stands", "damaged", frozenset(), ev(tracking=DELIVERED_SIGNED), "auto_approve"),
    ("a disagreement never lifts a wait: in transit stays nothing now", "damaged", frozenset({"not_received"}), ev(tracking=IN_TRANSIT), "refuse"),
]  # fmt: skip


@pytest.mark.parametrize(("category", "words", "evidence", "kind"), [w[1:] for w in WORDS], ids=[w[0] for w in WORDS])
def test_the_customers_words_count_beside_the_agents_category(
    category: ClaimCategory, words: frozenset[Read], evidence: Evidence, kind: str
) -> None:
    claim = Claim(category=category, evidence=evidence, words=words)
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind == kind, verdict.reasons


def test_a_disagreement_says_both_readings_in_plain_words() -> None:
    claim = Claim(category="damaged", evidence=ev(tracking=DELIVERED_SIGNED), words=frozenset({"not_received"}))
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    said = "the agent filed the claim as damaged, but the customer's words say not received"
    assert verdict.reasons[0] == said


WANTED: list[tuple[str, ClaimCategory, frozenset[Read], Evidence, Order, str, tuple[str, ...]]] = [
    # (what, category, words, evidence so far, order, amount, what policy still wants looked up)
    ("a plain claim paid at once: the charge's risk", "other", frozenset(), Evidence(), ORDER, "42.00", ("risk",)),
    ("a plain claim for a person: nothing", "other", frozenset(), Evidence(), ORDER, "120.00", ()),
    ("a refusal: nothing", "other", frozenset(), Evidence(), ORDER, "130.01", ()),
    ("the words say never arrived, the agent says damaged: tracking first", "damaged", frozenset({"not_received"}), Evidence(), ORDER, "42.00", ("tracking",)),
    ("sent it back: the return", "other", frozenset({"returned"}), Evidence(), ORDER, "42.00", ("returns",)),
    ("charged twice: the risk, whatever the amount", "other", frozenset({"duplicate_charge"}), Evidence(), ORDER, "120.00", ("risk",)),
    ("damaged, delivered: then the risk", "damaged", frozenset({"damaged"}), Evidence(tracking=DELIVERED_SIGNED), ORDER, "42.00", ("risk",)),
    ("never arrived, in transit: nothing more (nothing is paid now)", "not_received", frozenset(), Evidence(tracking=IN_TRANSIT), ORDER, "42.00", ()),
    ("a failed look-up is not tried again", "not_received", frozenset(), Evidence(failed={"tracking": "503"}), ORDER, "42.00", ()),
    ("never shipped: no tracking to read", "damaged", frozenset(), Evidence(), ORDER.model_copy(update={"tracking_code": ""}), "42.00", ("risk",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("category", "words", "evidence", "order", "amount", "wanted"), [w[1:] for w in WANTED], ids=[w[0] for w in WANTED]
)
def test_policy_names_the_look_ups_it_still_needs(
    category: ClaimCategory,
    words: frozenset[Read],
    evidence: Evidence,
    order: Order,
    amount: str,
    wanted: tuple[str, ...],
) -> None:
    claim = Claim(category=category, evidence=evidence, words=words)
    found = look_ups_wanted(
        amount=Decimal(amount), currency="USD", order=order, as_of=NOW, limits=LIMITS, requested=None, claim=claim
    )
    assert found == wanted


LABEL: list[tuple[str, ClaimCategory, Evidence, str]] = [
    # Refunds recorded before the whole case counted replay with the category's one look-up: these rows hold that.
    ("by label: damaged needs nothing", "damaged", Evidence(), "auto_approve"),
    ("by label: an in-transit record is ignored for damaged", "damaged", Evidence(tracking=IN_TRANSIT), "auto_approve"),
    ("by label: an early fraud warning pays and flags", "duplicate_charge", Evidence(risk=RiskSignals(charge_id="ch_x", early_fraud_warnings=[EFW])), "auto_approve"),
    ("by label: never arrived, delivered: a person", "not_received", Evidence(tracking=DELIVERED_SIGNED), "needs_approval"),
]  # fmt: skip


@pytest.mark.parametrize(("category", "evidence", "kind"), [r[1:] for r in LABEL], ids=[r[0] for r in LABEL])
def test_refunds_judged_by_their_label_replay_as_recorded(
    category: ClaimCategory, evidence: Evidence, kind: str
) -> None:
    claim = Claim(category=category, evidence=evidence, words=frozenset({"not_received"}), by_label=True)
    verdict = decide(amount=Decimal("42.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind == kind, verdict.reasons
