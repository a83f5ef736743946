"""Pure decision types: what a request, a proposal, a verdict and a phase are (what the customer is told:
agent/replies.py)."""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from steps.evidence import QuestionKind
from steps.records import (
    SUPPORTED_CURRENCIES,
    ApprovalRecord,
    exponent,
    minor_unit_problem,
    supported,
)

__all__ = [
    "CLAIM_CATEGORIES",
    "ApprovalRecord",
    "ClaimCategory",
    "Phase",
    "RecordedProposal",
    "RefundProposal",
    "RefundRequest",
    "Verdict",
    "VerdictKind",
    "refund_id_of",
]

MAX_MESSAGE_CHARS = 4000
_ORDER_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class Phase(StrEnum):
    """Where a refund is: the ``status`` of its row, written in the same transaction as each step's effect."""

    RECEIVED = "received"
    DECIDING = "deciding"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_CUSTOMER = "awaiting_customer"  # asked the customer for what only they can give (agent/questions.py)
    PAYING = "paying"
    SETTLING = "settling"  # the provider took the refund but has not settled it (pending)
    COMPLETED = "completed"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RefundRequest(BaseModel):
    """A customer's refund request as it arrives; its idempotency key becomes the workflow id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    order_id: str
    message: str
    amount: Decimal | None = None
    currency: str | None = None

    @field_validator("order_id")
    @classmethod
    def _order_id(cls, value: str) -> str:
        if not _ORDER_ID.match(value):
            raise ValueError("order_id must be 1-64 letters, digits or _.:-")
        return value

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("message must not be empty")
        if "\x00" in value:
            raise ValueError("message must not contain NUL characters")
        if len(value) > MAX_MESSAGE_CHARS:
            raise ValueError(f"message must be at most {MAX_MESSAGE_CHARS} characters")
        return value

    @field_validator("amount")
    @classmethod
    def _amount(cls, value: Decimal | None) -> Decimal | None:
        if value is None:
            return None
        if not value.is_finite():
            raise ValueError("amount must be a finite number")
        if value <= 0:
            raise ValueError("amount must be greater than zero")
        places = -value.as_tuple().exponent  # type: ignore[operator]
        finest = max(exponent(c) for c in SUPPORTED_CURRENCIES)
        if places > finest:
            raise ValueError(f"amount has {places} decimal places; no supported currency has more than {finest}")
        return value

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str | None) -> str | None:
        if value is None:
            return None
        code = value.strip().upper()
        if not supported(code):
            raise ValueError(f"unsupported currency {value!r}; supported: {', '.join(SUPPORTED_CURRENCIES)}")
        return code

    @model_validator(mode="after")
    def _amount_in_currency(self) -> RefundRequest:
        """An amount with its currency named is checked against that currency's minor units here (without one, it
        is checked against the order's currency when the order is read)."""
        if self.amount is not None and self.currency is not None:
            problem = minor_unit_problem(self.amount, self.currency)
            if problem:
                raise ValueError(problem)
        return self


ClaimCategory = Literal[
    "not_received", "damaged", "returned", "wrong_item", "not_as_described", "duplicate_charge", "changed_mind", "other"
]
#: Durable: recorded with every refund (``refunds.claim_category``); never rename one.
CLAIM_CATEGORIES: tuple[ClaimCategory, ...] = (
    "not_received",
    "damaged",
    "returned",
    "wrong_item",
    "not_as_described",
    "duplicate_charge",
    "changed_mind",
    "other",
)


class RefundProposal(BaseModel):
    """What the agent proposes. It is advice: policy decides what is paid."""

    # The field docstrings become the output schema's descriptions: the model reads them.
    model_config = ConfigDict(use_attribute_docstrings=True)

    amount: Decimal = Field(ge=0)
    """Amount to refund in the order's currency; 0 when no refund should be made."""
    currency: str
    """ISO 4217 code of the order's currency."""
    reason: str = Field(max_length=1000)
    """One or two sentences for the approver: why this amount."""
    customer_reply: str = Field(max_length=2000)
    """The reply to send the customer, in their language, stating the amount and what happens next."""
    category: ClaimCategory
    """What the customer claims: not_received (never arrived, late, lost), damaged, returned (sent it back),
    wrong_item, not_as_described, duplicate_charge (charged twice, a charge they do not recognise), changed_mind,
    or other."""

    @field_validator("currency")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.strip().upper()

    @field_validator("reason", "customer_reply")
    @classmethod
    def _printable(cls, value: str) -> str:
        return value.replace("\x00", "")  # model text is stored in Postgres, which refuses NUL


class RecordedProposal(RefundProposal):
    """A proposal as a model answered before the category was asked for: read back from a recorded model response
    (agent/legacy.py), its category is ``other``. New answers must name one (``RefundProposal``)."""

    category: ClaimCategory = "other"


VerdictKind = Literal["auto_approve", "needs_approval", "refuse", "ask_customer"]


class Verdict(BaseModel):
    """Policy's judgement: ``amount`` is what may be paid (at once, once a person approves, or nothing)."""

    model_config = ConfigDict(frozen=True)

    kind: VerdictKind
    amount: Decimal
    currency: str
    reasons: tuple[str, ...] = ()
    refundable: Decimal = Decimal(0)
    requested: Decimal | None = None
    """What the customer asked for, which bounds ``amount``; None: no amount named (the bound is ``refundable``)."""
    findings: tuple[str, ...] = ()
    """What the recorded evidence established, in plain words, whatever the verdict (the approver reads them)."""
    flags: tuple[str, ...] = ()
    """Signals recorded with the refund for people to follow up (``early_fraud_warning``), never a reason to pay."""
    customer_note: str | None = None
    """What the customer is told when the evidence decides (the parcel's expected date, how to return it)."""
    question: QuestionKind | None = None
    """With ``ask_customer``: what the customer is asked for (agent/questions.py words it)."""

    @property
    def summary(self) -> str:
        return f"{self.kind}: {'; '.join(self.reasons) or 'within policy'}"


def refund_id_of(workflow_id: str) -> str:
    """The refund a workflow belongs to: its own id, or the part before '/' (``{refund_id}/settle``, ...)."""
    return workflow_id.split("/", 1)[0]
