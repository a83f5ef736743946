"""What the customer is told: composed from how the refund ended, never from what the model hoped would happen.

A refund sends its customer one message about its outcome (steps/notify.py keys it by refund), when it ends:
paid, refused, not decided in time (expired), or not found. Before that, a refund that waits for a person sends
one more (``waiting``): a person must confirm it, and by when the customer will hear from us (the approval's
deadline, when an expiry would end it). While it waits for the provider nothing is sent. Where the evidence
decided, policy's own note is the message.

The model's draft (``RefundProposal.customer_reply``) is sent only when it fits the outcome: the refund was paid
at once (``auto_approve``), and the draft names the amount paid and no other (a draft never promises money that
was not paid), says the money is refunded, and promises no review, approval or wait (``draft_fits``). Every other
message is ours. A refusal names the amount the customer asked for, a payment the amount paid, and no message
names 0.00 as a refund. Amounts go through ``steps.records.format_money``. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from steps.evidence import QuestionKind
from steps.records import format_moment, format_money

__all__ = [
    "asked",
    "draft_fits",
    "expired",
    "not_found",
    "paid",
    "paid_at_once",
    "plain_reasons",
    "refused",
    "rejected_by_person",
    "reminded",
    "unanswered",
    "waiting",
]

ZERO = timedelta()
ANOTHER_LOOK = "Reply to this message if you would like us to take another look."
#: A draft that speaks of a review, an approval or a wait is not about a refund paid at once.
_PENDING = re.compile(
    r"review|approval|approver|pending|get back to you|look into|our team|will let you know|"
    r"prüf|genehmigung|vérif|examin|revis|aprobaci|verific|esamin|確認|担当",
    re.I,
)
#: A draft for a paid refund says the money was refunded, sent or approved (in a few languages).
_SAYS_PAID = re.compile(
    r"refunded|been (sent|approved|issued|paid)|we (have )?(sent|approved|issued|paid)|approved a refund|on its way|"
    r"will reach|erstattet|rembours|reembols|rimborsat|返金しました",
    re.I,
)

#: Policy's reasons (agent/policy.py, agent/evidence_policy.py) in the customer's words, by how they start or
#: what they contain; a reason not listed gets the general sentence. The customer never reads the limits' names.
_PLAIN: tuple[tuple[str, str], ...] = (
    ("the order does not exist", "we could not find this order"),
    ("the order disappeared", "we could not find this order"),
    ("disputed", "a dispute about this payment is open with your bank, and the dispute decides its refund"),
    ("open dispute", "a dispute about this payment is open with your bank, and the dispute decides its refund"),
    ("not paid", "this order has not been paid, so there is nothing to refund"),
    ("refund window", "the order is past the period in which we can refund it"),
    ("already fully refunded", "this order has already been refunded in full"),
    ("does not match the order", "a refund can only be made in the order's currency"),
    ("exceeds the refundable", "the amount is more than what is left to refund on this order"),
    ("absolute cap", "the amount is more than we can refund for a single request"),
    ("the customer asked for", "the amount is more than you asked for"),
    ("the approval is for", "the amount differs from the one that was approved"),
    ("is finer than", "the amount has more decimal places than its currency allows"),
    ("refunds move in steps of", "the amount cannot be paid out exactly in its currency"),
    ("of this order is still open", "an earlier refund request for this order is still open, and we answer it first"),
)
_GENERAL = "it is outside our refund policy"


def plain_reasons(reasons: Iterable[str]) -> list[str]:
    """Policy's reasons in the customer's words, each said once, in order; the general sentence when none is known."""
    said: list[str] = []
    for reason in reasons:
        text = reason.removeprefix("re-check before paying: ").casefold()
        plain = next((words for marker, words in _PLAIN if marker in text), _GENERAL)
        if plain not in said:
            said.append(plain)
    return said or [_GENERAL]


def paid(amount: Decimal, currency: str) -> str:
    """The refund was paid: how much, and when it arrives."""
    return (
        f"Your refund of {format_money(amount, currency)} has been approved and sent. It will reach your "
        "original payment method within 5-10 business days."
    )


def refused(amount: Decimal | None, currency: str, reasons: Iterable[str]) -> str:
    """Policy refused ``amount`` (the amount asked): why, in plain words (never policy's internal strings). Without
    an amount above zero (the customer named none, and nothing was refundable) it names no amount: a customer
    never reads that we cannot refund 0.00."""
    why = "; ".join(plain_reasons(reasons))
    what = format_money(amount, currency) if amount is not None and amount > 0 else "anything"
    return f"We are sorry: we cannot refund {what} on this order because {why}. {ANOTHER_LOOK}"


def waiting(amount: Decimal, currency: str, by: datetime, *, answered: bool = False) -> str:
    """Parked for a person: nothing is decided yet, and the customer hears from us again by ``by`` (the deadline
    at which, undecided, the refund expires and they are told so). ``answered``: parked with the customer's answer
    to a question, which a person now reviews (an answer never pays on its own)."""
    money, when = format_money(amount, currency), format_moment(_rounded_up(by))
    if answered:
        return (
            f"Thank you for your answer. A member of our team now reviews your request for a refund of {money} with "
            f"it and needs to confirm it before it is sent; you will hear from us again by {when}."
        )
    return (
        f"We have received your request for a refund of {money}. A member of our team needs to confirm it before "
        f"it is sent; you will hear from us again by {when}."
    )


#: What each question asks for, exactly (agent/evidence_policy.py decides when a refund asks).
NEEDED: dict[QuestionKind, str] = {
    "delivery": (
        "Our carrier shows your parcel as delivered, with a photo taken at the door. Please tell us whether it has "
        "reached you since: confirm that you still have not received it, or tell us that it turned up."
    ),
    "photo": (
        "Please send us a photo of the item showing what is wrong with it (a JPEG, PNG, GIF or WebP image of at "
        "most 5 MB)."
    ),
    "return_tracking": (
        "Our warehouse has not received your return yet. Please send us the tracking number of the parcel you sent "
        "it back in."
    ),
}


def _rounded_up(by: datetime) -> datetime:
    return by.replace(second=0, microsecond=0) + (timedelta(minutes=1) if by.second or by.microsecond else ZERO)


def asked(question: QuestionKind, link: str, by: datetime) -> str:
    """Asked for what only the customer can give: what exactly, where to answer, and by when."""
    return (
        f"To decide your refund we need one thing from you. {NEEDED[question]} Answer here: {link} (a reply on "
        f"your support ticket works too, if you wrote to us through one). We need your answer by "
        f"{format_moment(_rounded_up(by))}; without it we close this request then."
    )


def reminded(question: QuestionKind, link: str, by: datetime) -> str:
    """The one reminder before the question expires."""
    return (
        f"A reminder: we are still waiting for your answer to decide your refund. {NEEDED[question]} Answer here: "
        f"{link}. Without an answer by {format_moment(_rounded_up(by))} we close this request."
    )


def unanswered(question: QuestionKind) -> str:
    """The question expired unanswered: the request is closed, and why."""
    what = {
        "delivery": "whether your parcel arrived",
        "photo": "a photo of the item",
        "return_tracking": ("the tracking number of your return"),
    }[question]
    return (
        f"We are sorry: we asked you for {what} and did not hear back in time, so we have closed this refund request "
        "without a refund. You are welcome to send a new request with that information."
    )


def wait_ended(question: QuestionKind) -> str:
    """A support lead closed the request before the customer answered its question."""
    what = {
        "delivery": "whether your parcel arrived",
        "photo": "a photo of the item",
        "return_tracking": "the tracking number of your return",
    }[question]
    return (
        f"We asked you for {what}; our support team has now closed this refund request without a refund, so there "
        "is no need to answer. You are welcome to send a new request, or to reply to your support ticket."
    )


def rejected_by_person(amount: Decimal, currency: str) -> str:
    """A person decided against the refund."""
    return f"We are sorry: we have decided not to refund {format_money(amount, currency)} on this order. {ANOTHER_LOOK}"


def expired(amount: Decimal, currency: str) -> str:
    """No one decided before the approval's deadline: the refund ended unpaid."""
    return (
        f"We are sorry: we could not confirm your refund of {format_money(amount, currency)} in time, so it has "
        f"not been made. {ANOTHER_LOOK}"
    )


def not_found(amount: Decimal, currency: str) -> str:
    """The order could not be found when the refund was to be paid."""
    return refused(amount, currency, ["the order does not exist"])


_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|"
    r"nov(?:ember)?|dec(?:ember)?)\b"
)
#: Numbers in a draft that are not money: ids (ord_1001, #1001), dates and times, and how long something takes.
_NOT_MONEY = re.compile(
    r"\b[a-z]+_\w+|#\d+|\b\d{4}-\d{2}-\d{2}(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?|\b\d{1,2}/\d{1,2}/\d{2,4}\b|"
    r"\b\d{1,2}:\d{2}\b|"
    rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b(?:,? \d{{4}})?|\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}(?: \d{{4}})?|"
    r"\b\d+(?: ?(?:-|\u2013|to|bis|à|a) ?\d+)? ?(?:business |working |bank )?"
    r"(?:days?|hours?|weeks?|months?|minutes?|werktage?n?|tage?n?|jours?|d[ií]as|giorni|営業日|日)",
    re.I,
)
#: A number as written in a draft: digits, with thousands and decimal separators (``,`` ``.`` and thin spaces
#: before a group of three), never a space between two separate numbers.
_NUMBER = re.compile(r"\d+(?:(?:[.,]|[\u00a0\u202f ](?=\d{3}(?!\d)))\d+)*")


def _readings(token: str) -> set[Decimal]:
    """What a written number can mean: 1,250.00 and 1.250,00 both read 1250.00; 958 reads 958."""
    token = re.sub(r"[\u00a0\u202f ]", "", token)
    found: set[Decimal] = set()
    for candidate in (token.replace(",", ""), token.replace(".", "").replace(",", ".")):
        try:
            found.add(Decimal(candidate))
        except InvalidOperation:
            continue
    return found


def _amounts(text: str) -> list[set[Decimal]]:
    """The readings of each number a draft writes that could be money (ids, dates and durations left out)."""
    return [_readings(token) for token in _NUMBER.findall(_NOT_MONEY.sub(" ", text))]


def draft_fits(draft: str | None, amount: Decimal) -> bool:
    """Whether the model's draft may be sent for a refund paid at once of ``amount``: it names that amount and no
    other (958, 958.00, $958, USD 958, 958,00 and 1,000.00 are all amounts; ids such as ord_1001, dates, times and
    durations such as 5-10 business days are not), no percentage (a share of what, we cannot check), says the
    money is refunded, and speaks of no review, approval or wait."""
    if not draft or not draft.strip() or "%" in draft:
        return False
    amounts = _amounts(draft)
    named = bool(amounts) and all(amount in readings for readings in amounts)
    return named and bool(_SAYS_PAID.search(draft)) and not _PENDING.search(draft)


def paid_at_once(draft: str | None, amount: Decimal, currency: str) -> str:
    """The message for a refund paid without a person: the model's draft when it fits (``draft_fits``), else ours."""
    return draft if draft is not None and draft_fits(draft, amount) else paid(amount, currency)
