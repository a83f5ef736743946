"""What recorded evidence says about a claim: pure rules on the look-ups' step outputs, never on the model's words.

``judge_case`` returns a ``Finding``: nothing to add (the usual money rules decide), refuse for now (the parcel is
on its way, nothing was sent back yet: the customer is told what to do), a person must look (the carrier says
delivered, the claim could not be checked, the evidence contradicts the claim, the card issuer reported fraud),
refuse (the dispute decides), or a lower bound (only the lines the warehouse received). It judges every category
the claim has (the model's and the customer's words', agent/claim_reading.py) and every look-up that was made,
whichever category asked for it; ``needed`` says which look-ups the categories need on this order, and a needed
one that was not made (or failed) goes to a person, so a model that skips a look-up never gets a refund paid
unchecked. ``judge`` is the rule refunds decided before the whole case counted kept: the model's category and its
one look-up (they replay with it, agent/workflow.py ``WHOLE_CASE_PATCH``).

Where the gap is one the customer can close, ``judge_case`` asks them (``ask``, for the question kinds allowed): a
parcel the carrier shows delivered with a photo at the door while they say it never came (``delivery``: confirm
it), goods claimed broken or wrong while the carrier still shows the parcel moving (``photo``: of the item), a
return they say they sent that the warehouse has not seen (``return_tracking``: its tracking number). With their
answer recorded (``Evidence.answer``) the same rules judge it, and nothing is asked again. An answer never pays on
its own: what the customer says or sends against the carrier's or the warehouse's record goes to a person with the
answer as evidence; "it arrived after all" refuses, and no answer by the deadline closes the refund.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Literal

from agent.domain import ClaimCategory
from steps.evidence import CustomerAnswer, Evidence, LookUp, QuestionKind, ReturnReceipt, Tracking
from steps.records import Order, format_money

FindingKind = Literal["none", "ask", "refuse", "wait", "person"]
#: Claims that only evidence can settle, and the look-up that settles them.
NEEDS: dict[ClaimCategory, Literal["tracking", "returns", "risk"]] = {
    "not_received": "tracking",
    "returned": "returns",
    "changed_mind": "returns",
    "duplicate_charge": "risk",  # a charge they do not recognise may be disputed: the dispute would decide
}
#: How long after its expected date a parcel still counts as on its way.
ETA_GRACE = timedelta(days=1)
_MOVING = ("pre_transit", "in_transit", "out_for_delivery")


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    reasons: tuple[str, ...] = ()
    """Why the verdict is what it is (``refuse``, ``wait``, ``person``)."""
    facts: tuple[str, ...] = ()
    """What the evidence established, whatever the verdict."""
    bound: Decimal | None = None
    """At most this may be refunded (the received lines of a return); None: no bound from the evidence."""
    customer_note: str | None = None
    flags: tuple[str, ...] = ()
    question: QuestionKind | None = None
    """With ``ask``: what the customer is asked for."""


def _day(at: datetime) -> str:
    return at.strftime("%Y-%m-%d")


def judge(category: ClaimCategory, evidence: Evidence, order: Order, as_of: datetime) -> Finding:
    """The evidence's word on a claim by its category alone: the charge's risk first (a dispute decides), then what
    the category needs (refunds decided before the whole case counted replay with it)."""
    flags: tuple[str, ...] = ()
    facts: list[str] = []
    if evidence.risk is not None:
        for dispute in evidence.risk.open_disputes:
            reason = f"the charge has an open dispute ({dispute.dispute_id}, {dispute.reason}); the dispute decides"
            note = "Your bank has opened a dispute on this payment; its outcome decides the refund, so we cannot "
            note += "refund it separately."
            return Finding("refuse", (reason,), (reason,), customer_note=note)
        if evidence.risk.early_fraud_warnings:
            warning = evidence.risk.early_fraud_warnings[0]
            facts.append(f"the card issuer reported the charge as fraud ({warning.warning_id}, {warning.fraud_type})")
            flags = ("early_fraud_warning",)
    need = NEEDS.get(category)
    if need is None:
        return Finding("none", facts=tuple(facts), flags=flags)
    if need in evidence.failed:
        reason = f"the claim could not be checked: {need} could not be read ({evidence.failed[need]})"
        return Finding("person", (reason,), tuple(facts), flags=flags)
    if need == "risk":  # what the risk says (a dispute, a fraud warning) was judged above
        if evidence.risk is None:
            return Finding("person", ("the claim was not checked against the charge's disputes and fraud warnings",))
        return Finding("none", facts=tuple(facts), flags=flags)
    found = _tracking(evidence.tracking, order, as_of) if need == "tracking" else _returns(evidence.returns, order)
    return Finding(
        found.kind, found.reasons, (*facts, *found.facts), found.bound, found.customer_note, (*flags, *found.flags)
    )


#: Claims about the goods in hand: the carrier must show them delivered.
ABOUT_THE_GOODS: frozenset[str] = frozenset({"damaged", "wrong_item", "not_as_described"})
_RETURNS_CLAIMS = frozenset({"returned", "changed_mind"})
_RANK: dict[FindingKind, int] = {"none": 0, "ask": 1, "person": 2, "wait": 3, "refuse": 4}


def needed(categories: frozenset[str], order: Order) -> tuple[LookUp, ...]:
    """The look-ups the claim's categories need, as far as the order's facts allow them (no tracking code: no
    tracking to read; no charge: no risk). The charge's risk for a refund paid at once is policy's (agent/policy)."""
    wanted: list[LookUp] = []
    if order.tracking_code and categories & {"not_received", *ABOUT_THE_GOODS}:
        wanted.append("tracking")
    if categories & _RETURNS_CLAIMS:
        wanted.append("returns")
    if order.charge_id and "duplicate_charge" in categories:
        wanted.append("risk")
    return tuple(wanted)


def judge_case(
    categories: frozenset[str], evidence: Evidence, order: Order, as_of: datetime, ask: frozenset[str] = frozenset()
) -> Finding:
    """The evidence's word on the whole claim: the charge's risk (a dispute refuses, a fraud warning goes to a
    person), then, for every look-up made or needed, what it says about each category; the strictest wins. ``ask``:
    the question kinds the customer may be asked (none once they answered one: a refund asks once). A question is
    asked only where it is what decides: where something stricter decides anyway, the finding is the one without
    questions (a question never turns a refusal into a person's decision)."""
    if evidence.answer is not None or not ask:
        return _judge_case(categories, evidence, order, as_of, frozenset())
    found = _judge_case(categories, evidence, order, as_of, ask)
    return found if found.kind == "ask" else _judge_case(categories, evidence, order, as_of, frozenset())


def _judge_case(
    categories: frozenset[str], evidence: Evidence, order: Order, as_of: datetime, ask: frozenset[str]
) -> Finding:
    answer = evidence.answer
    if evidence.risk is not None and evidence.risk.open_disputes:
        return judge("duplicate_charge", evidence, order, as_of)  # the dispute decides, as it always did
    found: list[Finding] = []
    if evidence.risk is not None and evidence.risk.early_fraud_warnings:
        warning = evidence.risk.early_fraud_warnings[0]
        fact = f"the card issuer reported the charge as fraud ({warning.warning_id}, {warning.fraud_type})"
        found.append(Finding("person", (f"{fact}; a person decides",), (fact,), flags=("early_fraud_warning",)))
    for need in needed(categories, order):
        if need in evidence.failed:
            reason = f"the claim could not be checked: {need} could not be read ({evidence.failed[need]})"
            found.append(Finding("person", (reason,)))
        elif getattr(evidence, need) is None:
            found.append(Finding("person", (f"the claim needs the {_NAMES[need]}, and it was not looked up",)))
    if "not_received" in categories and not order.tracking_code:
        found.append(Finding("person", ("the order has no tracking number to check the claim against",)))
    if evidence.tracking is not None:
        found += _tracking_for(categories, evidence.tracking, order, as_of, ask, answer)
    if evidence.returns is not None:
        returned = _returns(evidence.returns, order)
        if categories & _RETURNS_CLAIMS:
            found.append(_return_sent(categories, evidence.returns, returned, ask, answer))
        else:
            found.append(Finding("none", facts=returned.facts))
    return _strictest(found)


_NAMES: dict[LookUp, str] = {
    "tracking": "carrier's tracking",
    "returns": "warehouse's return",
    "risk": "charge's disputes and fraud warnings",
    "tickets": "earlier tickets",
}


def _tracking_for(
    categories: frozenset[str],
    tracking: Tracking,
    order: Order,
    as_of: datetime,
    ask: frozenset[str] = frozenset(),
    answer: CustomerAnswer | None = None,
) -> list[Finding]:
    """A tracking record counts for every category: a parcel not delivered contradicts a claim about the goods."""
    found = [_not_received(tracking, as_of, ask, answer)] if "not_received" in categories else []
    where = f"{tracking.carrier} {tracking.tracking_code}"
    said = tracking.status.replace("_", " ") if tracking.found else "unknown to the carrier"
    if categories & ABOUT_THE_GOODS:
        if tracking.found and tracking.status == "delivered":
            found.append(Finding("none", facts=_delivery(tracking, as_of).facts))
        else:
            claim = ", ".join(sorted(c.replace("_", " ") for c in categories & ABOUT_THE_GOODS))
            reason = f"the claim ({claim}) is about goods in hand, but the carrier shows {where} {said}"
            person = Finding("person", (reason,), (f"the carrier shows {where} {said}",))
            # A parcel still shown moving may have come without its last scan: a photo shows the goods in hand.
            moving = tracking.found and tracking.status in _MOVING
            found.append(_photo(person, answer) if moving and (answer or "photo" in ask) else person)
    if not found:
        found.append(Finding("none", facts=(f"the carrier shows {where} {said}",)))
    return found


def _photo(person: Finding, answer: CustomerAnswer | None) -> Finding:
    """Goods claimed in hand on a parcel still moving: ask for a photo of them; with one, a person looks at it
    against the carrier's record (any image could be sent); asked and sent none, a person looks too."""
    if answer is None:
        return replace(person, kind="ask", question="photo")
    if answer.question != "photo":
        return person
    photos = [f for f in answer.files if f.image]
    if not photos:
        return replace(
            person, reasons=("the customer was asked for a photo of the item and sent none", *person.reasons)
        )
    shown = ", ".join(f"{f.content_type}, {f.size} bytes" for f in photos)
    fact = f"the customer sent {len(photos)} photo(s) of the item ({shown})"
    reason = f"{fact} while the carrier still shows the parcel moving: a person looks at them"
    return Finding("person", (reason, *person.reasons), (*person.facts, fact))


def _not_received(tracking: Tracking, as_of: datetime, ask: frozenset[str], answer: CustomerAnswer | None) -> Finding:
    """A parcel the customer says never came: the carrier's word, and where it shows a photo at the door, the
    customer's confirmation (asked once): still not received, a person weighs it against the carrier's photo; it
    arrived after all, refused."""
    base = _delivery(tracking, as_of)
    if not (tracking.found and tracking.status == "delivered" and tracking.proof == "photo"):
        return base
    if answer is None:
        return replace(base, kind="ask", question="delivery") if "delivery" in ask else base
    if answer.question != "delivery":
        return base
    received = answer.received if answer.received is not None else says_received(answer.text)
    if received is False:
        fact = "the customer confirmed the parcel never reached them"
        reason = f"{fact}, against the carrier's photo at the door: a person weighs the two"
        return Finding("person", (reason, *base.reasons), (*base.facts, fact))
    if received:
        reason = "the customer said the parcel arrived after all"
        note = "Thank you for letting us know your parcel arrived. As it did, there is no refund for a missing parcel."
        return Finding("refuse", (reason,), (*base.facts, reason), customer_note=note)
    return replace(base, reasons=("the customer's answer does not say whether the parcel arrived", *base.reasons))


def _return_sent(
    categories: frozenset[str],
    receipt: ReturnReceipt,
    returned: Finding,
    ask: frozenset[str],
    answer: CustomerAnswer | None,
) -> Finding:
    """A return the customer says they sent that the warehouse has not seen (none opened, a label never scanned):
    ask for its tracking number (once); given one, a person checks it with the carrier; none given, as before."""
    if "returned" not in categories or receipt.status not in ("none", "label_created"):
        return returned
    if answer is None:
        return replace(returned, kind="ask", question="return_tracking") if "return_tracking" in ask else returned
    if answer.question != "return_tracking" or not answer.tracking_number:
        return returned
    fact = f"the customer says the return was sent with tracking number {answer.tracking_number}"
    reason = f"{fact}, but the warehouse shows {returned.reasons[0] if returned.reasons else 'no return'}"
    return Finding("person", (reason,), (*returned.facts, fact))


_ARRIVED = re.compile(
    r"\b(it|parcel|package|order|item)\b[^.!?]{0,30}\b(arrived|turned up|came|showed up)\b|\bfound (it|the parcel|the "
    r"package)\b|\b(i|we) (got|have|received) it\b|\bneighbou?r had it\b|\barrived after all\b",
    re.I,
)
_STILL_MISSING = re.compile(
    r"(?:\bnot|\bnever|n't|\bno)\b[^.!?]{0,30}\b(received|arrived|come|came|got|get|here|delivered|parcel|package)\b|"
    r"\bstill (missing|nothing|waiting)\b|\bnothing (came|arrived)\b",
    re.I,
)


def says_received(text: str) -> bool | None:
    """What the customer's words say about the parcel: False (still not received: a negation wins), True (it
    arrived), None (neither said)."""
    if _STILL_MISSING.search(text):
        return False
    return True if _ARRIVED.search(text) else None


def _strictest(found: list[Finding]) -> Finding:
    """One finding from several: the strictest kind with its reasons and note, every fact and flag, the lowest
    bound."""
    if not found:
        return Finding("none")
    kind = max((f.kind for f in found), key=_RANK.__getitem__)
    top = [f for f in found if f.kind == kind]
    bounds = [f.bound for f in found if f.bound is not None]
    return Finding(
        kind,
        tuple(dict.fromkeys(r for f in top for r in f.reasons)),
        tuple(dict.fromkeys(x for f in found for x in f.facts)),
        min(bounds) if bounds else None,
        next((f.customer_note for f in top if f.customer_note), None),
        tuple(dict.fromkeys(x for f in found for x in f.flags)),
        next((f.question for f in top if f.question), None),
    )


def _tracking(tracking: Tracking | None, order: Order, as_of: datetime) -> Finding:
    if not order.tracking_code:
        return Finding("person", ("the order has no tracking number to check the claim against",))
    if tracking is None:
        return Finding("person", ("the claim was not checked against the carrier's tracking",))
    return _delivery(tracking, as_of)


def _delivery(tracking: Tracking, as_of: datetime) -> Finding:
    """What a tracking record says about a parcel the customer says never came."""
    where = f"{tracking.carrier} {tracking.tracking_code}"
    if not tracking.found or tracking.status == "unknown":
        return Finding("person", (f"the carrier has no usable record of {where}",))
    if tracking.status == "delivered":
        when = f" on {_day(tracking.delivered_at)}" if tracking.delivered_at else ""
        proof = {"signature": f", signed by {tracking.signed_by or 'someone'}", "photo": ", with a photo"}
        fact = f"the carrier shows {where} delivered{when}{proof.get(tracking.proof, ', without proof')}"
        return Finding("person", (fact,), (fact,))
    if tracking.status in ("return_to_sender", "failure"):
        said = "returned to sender" if tracking.status == "return_to_sender" else "failed delivery"
        return Finding("none", facts=(f"the carrier shows {where}: {said}",))
    if tracking.est_delivery is None:
        return Finding("person", (f"{where} is {tracking.status.replace('_', ' ')} with no expected date",))
    due = _day(tracking.est_delivery)
    if as_of > tracking.est_delivery + ETA_GRACE:
        return Finding("person", (f"{where} is past its expected delivery date {due}",))
    fact = f"{where} is on its way ({tracking.status.replace('_', ' ')}), expected by {due}"
    note = (
        f"Your parcel is on its way with {tracking.carrier} (tracking {tracking.tracking_code}) and is expected by "
        f"{due}. If it has not arrived by then, reply to this message and we will look again."
    )
    return Finding("wait", (fact,), (fact,), customer_note=note)


def _returns(receipt: ReturnReceipt | None, order: Order) -> Finding:
    if receipt is None:
        return Finding("person", ("the claim was not checked against the warehouse's returns",))
    if receipt.status == "none":
        reason = "no return was opened for this order"
        note = (
            "We refund a return once our warehouse receives it. To send the item back, reply to this message and "
            "we will send you a return label."
        )
        return Finding("wait", (reason,), (reason,), customer_note=note)
    if receipt.status == "label_created":
        since = f" on {_day(receipt.label_created_at)}" if receipt.label_created_at else ""
        reason = f"the return label ({receipt.rma_id}) was created{since} and the parcel was never scanned"
        note = (
            f"We have not received your return yet: the label for return {receipt.rma_id} has not been used. "
            "Drop the parcel off with the carrier; we refund it as soon as our warehouse receives it."
        )
        return Finding("wait", (reason,), (reason,), customer_note=note)
    if receipt.status == "in_transit":
        reason = f"the return {receipt.rma_id} is on its way to the warehouse"
        note = f"Your return {receipt.rma_id} is on its way to us; we refund it as soon as our warehouse receives it."
        return Finding("wait", (reason,), (reason,), customer_note=note)
    received = [line for line in receipt.lines if line.received]
    money = format_money(receipt.received_amount, order.currency)
    listed = ", ".join(f"{line.description} x{line.quantity}" for line in received) or "nothing"
    fact = f"the warehouse received {listed} on return {receipt.rma_id} ({money})"
    if not received:
        note = f"Our warehouse has not received any item of return {receipt.rma_id} yet."
        return Finding("wait", (fact,), (fact,), customer_note=note)
    worn = [line for line in received if line.condition in ("damaged", "used", "missing")]
    if worn:
        said = ", ".join(f"{line.description} ({line.condition})" for line in worn)
        return Finding("person", (f"inspected on return: {said}",), (fact,), bound=receipt.received_amount)
    return Finding("none", facts=(fact,), bound=receipt.received_amount)
