# ruff: noqa: E501  (the table reads one row per case)
"""When policy asks the customer, what it asks, and how it judges the answer: pure rules, no I/O.

Policy asks only where the customer can close the gap (a parcel shown delivered with a photo that they say never
came; goods claimed broken while the carrier still shows the parcel moving; a return they say they sent that the
warehouse has not seen), only for the kinds ``CUSTOMER_QUESTIONS`` turns on, and once per refund: with an answer
recorded it never asks again, whatever is still missing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agent.claim_reading import read_claim
from agent.domain import ClaimCategory
from agent.evidence_policy import says_received
from agent.policy import Claim, Limits, decide
from agent.settings import CustomerQuestionSettings
from steps.evidence import AnswerFile, CustomerAnswer, Evidence, FraudWarning, ReturnReceipt, RiskSignals, Tracking
from steps.records import Order

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)
ALL = frozenset({"delivery", "photo", "return_tracking"})
LIMITS = Limits(auto_approve=Decimal("100.00"), absolute_cap=Decimal("10000.00"), window_days=60, questions=ALL)
ORDER = Order(
    order_id="ord_x", customer_id="cus_x", customer_name="X", customer_email="x@example.com", currency="USD",
    amount_captured=Decimal("60.00"), amount_refunded=Decimal(0), status="paid", paid_at=NOW - timedelta(days=10),
    charge_id="ch_x", items=["Mug"], carrier="UPS", tracking_code="1Z0001",
)  # fmt: skip
AT_THE_DOOR = Tracking(
    carrier="UPS", tracking_code="1Z0001", status="delivered", delivered_at=NOW - timedelta(days=2), proof="photo"
)
SIGNED = AT_THE_DOOR.model_copy(update={"proof": "signature", "signed_by": "J DOE"})
MOVING = Tracking(carrier="UPS", tracking_code="1Z0001", status="out_for_delivery", est_delivery=NOW)
SENT_BACK = Tracking(carrier="UPS", tracking_code="1Z0001", status="return_to_sender")
NO_RETURN = ReturnReceipt(order_id="ord_x", status="none")
UNSCANNED = ReturnReceipt(order_id="ord_x", rma_id="RMA-9", status="label_created", label_created_at=NOW)
CLEAN = RiskSignals(charge_id="ch_x")
PHOTO = AnswerFile(name="mug.jpg", content_type="image/jpeg", size=48_213, sha256="ab" * 32, stored=True)
PAGE = AnswerFile(name="mug.html", content_type="text/html", size=310, url="https://desk.example/a/1")


def judge(category: ClaimCategory, words: str, evidence: Evidence, limits: Limits = LIMITS) -> tuple[str, str | None]:
    claim = Claim(category, evidence, refund_id="r1", words=read_claim(words))
    verdict = decide(amount=Decimal("60.00"), currency="USD", order=ORDER, as_of=NOW, limits=limits, claim=claim)
    return verdict.kind, verdict.question


def answer(question: str, **fields: object) -> CustomerAnswer:
    return CustomerAnswer.model_validate({"question": question, "via": "link", **fields})


ASKS = [
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), "delivery"),
    ("damaged", "It arrived broken.", Evidence(tracking=MOVING, risk=CLEAN), "photo"),
    ("wrong_item", "You sent me the wrong mug.", Evidence(tracking=MOVING, risk=CLEAN), "photo"),
    ("returned", "I sent it back last week.", Evidence(returns=NO_RETURN, risk=CLEAN), "return_tracking"),
    ("returned", "I sent it back last week.", Evidence(returns=UNSCANNED, risk=CLEAN), "return_tracking"),
]


@pytest.mark.parametrize(("category", "words", "evidence", "question"), ASKS)
def test_policy_asks_where_only_the_customer_can_close_the_gap(
    category: ClaimCategory, words: str, evidence: Evidence, question: str
) -> None:
    assert judge(category, words, evidence) == ("ask_customer", question)


@pytest.mark.parametrize(("category", "words", "evidence", "question"), ASKS)
def test_a_claim_the_model_misfiled_is_never_put_to_the_customer(
    category: ClaimCategory, words: str, evidence: Evidence, question: str
) -> None:
    """Filed as another category than the words say (a misreading, or a planted instruction obeyed): the gap is judged
    as it was before questions, so a return nobody scanned stays refused and a person sees the rest."""
    before = "refuse" if question == "return_tracking" else "needs_approval"
    misfiled: ClaimCategory = "wrong_item" if category == "damaged" else "damaged"
    assert judge(misfiled, words, evidence) == (before, None)
    # Nothing else to hold it (an order never shipped, so nothing to track): still not asked.
    unshipped = ORDER.model_copy(update={"carrier": "", "tracking_code": ""})
    claim = Claim(misfiled, evidence, refund_id="r1", words=read_claim(words))
    verdict = decide(amount=Decimal("60.00"), currency="USD", order=unshipped, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind != "ask_customer" and (verdict.kind == "refuse") == (question == "return_tracking")


@pytest.mark.parametrize(("category", "words", "evidence", "question"), ASKS)
def test_with_asking_off_each_gap_is_what_it_was_before(
    category: ClaimCategory, words: str, evidence: Evidence, question: str
) -> None:
    before = "refuse" if question == "return_tracking" else "needs_approval"
    assert judge(category, words, evidence, replace(LIMITS, questions=frozenset())) == (before, None)
    others = replace(LIMITS, questions=ALL - {question})  # each kind is its own switch
    assert judge(category, words, evidence, others) == (before, None)


NOT_ASKED = [
    ("not_received", "It never arrived.", Evidence(tracking=SIGNED, risk=CLEAN)),  # someone signed: a person
    ("damaged", "It arrived broken.", Evidence(tracking=SENT_BACK, risk=CLEAN)),  # not theirs to photograph
    ("changed_mind", "I changed my mind.", Evidence(returns=NO_RETURN, risk=CLEAN)),  # nothing was sent
    ("damaged", "It arrived broken.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN)),  # delivered: the usual rules
]


@pytest.mark.parametrize(("category", "words", "evidence"), NOT_ASKED)
def test_policy_does_not_ask_what_an_answer_cannot_settle(
    category: ClaimCategory, words: str, evidence: Evidence
) -> None:
    assert judge(category, words, evidence)[0] != "ask_customer"


def test_a_stricter_finding_wins_over_a_question() -> None:
    warning = FraudWarning(warning_id="w", fraud_type="x", actionable=True, created=NOW)
    warned = CLEAN.model_copy(update={"early_fraud_warnings": [warning]})
    assert judge("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=warned)) == (
        "needs_approval", None,
    )  # fmt: skip
    # A question never lowers a refusal: a return nobody scanned on a charge reported as fraud stays refused.
    assert judge("returned", "I sent it back last week.", Evidence(returns=UNSCANNED, risk=warned)) == ("refuse", None)
    over = Limits(auto_approve=Decimal("100.00"), absolute_cap=Decimal("50.00"), window_days=60, questions=ALL)
    assert judge("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), over)[0] == "refuse"


ANSWERED = [
    # (claim, words, evidence without the answer, the answer, the verdict it gets)
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", received=False), "needs_approval"),
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", text="Still nothing here, I haven't received it."), "needs_approval"),
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", received=True), "refuse"),
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", text="Sorry, my neighbour had it!"), "refuse"),
    ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", text="Hello?"), "needs_approval"),
    ("damaged", "It arrived broken.", Evidence(tracking=MOVING, risk=CLEAN), answer("photo", files=[PHOTO]), "needs_approval"),
    ("damaged", "It arrived broken.", Evidence(tracking=MOVING, risk=CLEAN), answer("photo", files=[PAGE]), "needs_approval"),
    ("damaged", "It arrived broken.", Evidence(tracking=MOVING, risk=CLEAN), answer("photo", text="no photo, sorry"), "needs_approval"),
    ("returned", "I sent it back last week.", Evidence(returns=UNSCANNED, risk=CLEAN), answer("return_tracking", tracking_number="1Z999AA10123456784"), "needs_approval"),
    ("returned", "I sent it back last week.", Evidence(returns=UNSCANNED, risk=CLEAN), answer("return_tracking", text="I lost it"), "refuse"),
]  # fmt: skip


@pytest.mark.parametrize(("category", "words", "evidence", "given", "kind"), ANSWERED)
def test_the_answer_is_judged_by_the_same_rules_and_nothing_is_asked_twice(
    category: ClaimCategory, words: str, evidence: Evidence, given: CustomerAnswer, kind: str
) -> None:
    assert judge(category, words, evidence.model_copy(update={"answer": given})) == (kind, None)


@pytest.mark.parametrize(
    ("category", "words", "evidence", "given", "says"),
    [
        ("not_received", "It never arrived.", Evidence(tracking=AT_THE_DOOR, risk=CLEAN), answer("delivery", received=False),
         "the customer confirmed the parcel never reached them, against the carrier's photo at the door: a person weighs the two"),
        ("damaged", "It arrived broken.", Evidence(tracking=MOVING, risk=CLEAN), answer("photo", files=[PHOTO, PHOTO]),
         "the customer sent 2 photo(s) of the item (image/jpeg, 48213 bytes, image/jpeg, 48213 bytes) while the carrier "
         "still shows the parcel moving: a person looks at them"),
    ],
)  # fmt: skip
def test_an_answer_against_the_carriers_record_never_pays_a_person_weighs_both(
    category: ClaimCategory, words: str, evidence: Evidence, given: CustomerAnswer, says: str
) -> None:
    """Words or any image cannot outweigh the carrier's record on their own, however small the refund: the person
    reads the answer first among the reasons, with the carrier's side, and both among the findings."""
    claim = Claim(category, evidence.model_copy(update={"answer": given}), refund_id="r1", words=read_claim(words))
    verdict = decide(amount=Decimal("5.00"), currency="USD", order=ORDER, as_of=NOW, limits=LIMITS, claim=claim)
    assert verdict.kind == "needs_approval" and verdict.reasons[0] == says
    assert any("the carrier shows UPS 1Z0001" in reason for reason in verdict.reasons)
    answered = (
        "the customer confirmed the parcel never reached them"
        if category == "not_received"
        else says.split(" while")[0]
    )
    assert answered in verdict.findings and any(f.startswith("the carrier shows UPS 1Z0001") for f in verdict.findings)


def test_an_answer_to_one_question_never_lets_policy_ask_another() -> None:
    """A second gap after an answer goes to a person or is refused: here a delivery confirmed, then a claim that the
    goods are broken on a parcel still moving would have asked for a photo."""
    evidence = Evidence(tracking=MOVING, risk=CLEAN, answer=answer("delivery", received=False))
    assert judge("damaged", "It arrived broken.", evidence) == ("needs_approval", None)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ("I still have not received it", False),
        ("It never arrived.", False),
        ("haven't got it", False),
        ("Found it behind the bins, sorry!", True),
        ("It arrived after all", True),
        ("Please call me", None),
    ],
)
def test_the_customers_words_about_the_parcel_are_read_deterministically(words: str, said: bool | None) -> None:
    assert says_received(words) is said


def test_customer_questions_are_all_on_by_default_and_an_empty_setting_turns_them_off() -> None:
    assert CustomerQuestionSettings().enabled == ALL
    assert CustomerQuestionSettings(customer_questions="").enabled == frozenset()
    assert CustomerQuestionSettings(customer_questions=" photo , delivery").enabled == {"photo", "delivery"}
    with pytest.raises(ValueError, match="unknown question kind"):
        CustomerQuestionSettings(customer_questions="photo,selfie")
