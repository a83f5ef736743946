"""What the JSON endpoints answer, typed: the OpenAPI document describes every field a response carries.

Timestamps are RFC 3339 in UTC with a ``Z`` (``2026-12-02T14:03:11.52Z``) everywhere, nested objects included.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agent.claims import ClaimView
from agent.conversation import Conversation
from steps.store import utc

Timestamp = Annotated[datetime, AfterValidator(utc)]  # a stored time without a zone is UTC (SQLite keeps none)
Money = Annotated[str, Field(description="a decimal string in the currency's minor units", examples=["42.00"])]
#: The amount a refund was decided on, kept for clients written before the named amounts; neither what was asked
#: nor what was paid (an approval of less pays less). Deprecated: read ``amount_requested`` and ``amount_refunded``.
DecidedAmount = Annotated[
    Money | None,
    Field(
        deprecated=True,
        description="deprecated: the amount the refund was decided on (the agent's proposal as policy bounded it, "
        "else the amount asked), neither what was asked nor what was paid; read `amount_requested` and "
        "`amount_refunded`",
    ),
]
AmountRequested = Annotated[
    Money | None,
    Field(
        description="what the customer asked for, in `currency`; null when they named no amount (they asked for "
        "what the order has left to refund)"
    ),
]
AmountRefunded = Annotated[
    Money | None,
    Field(
        description="what was paid to the customer, in `currency`: the amount booked when the refund completed, "
        "which an approval of less makes lower than the amount asked; null until paid, and for a refund refused, "
        "failed or reversed (never 0)"
    ),
]
Status = Literal[
    "received",
    "deciding",
    "awaiting_approval",
    "awaiting_customer",
    "paying",
    "settling",
    "completed",
    "rejected",
    "failed",
    "cancelled",
]


class View(BaseModel):
    # "allow": a field added to a view's source is still answered (and flagged by the schema test until declared).
    model_config = ConfigDict(extra="allow")


class RefundSummary(View):
    refund_id: str
    status: str
    order_id: str
    currency: str
    amount: DecidedAmount
    amount_requested: AmountRequested
    amount_refunded: AmountRefunded
    created_at: Timestamp


class RefundPage(View):
    items: list[RefundSummary]
    next_cursor: str | None = Field(description="pass back as `cursor` for the next page; null on the last")


class OrderView(View):
    order_id: str
    customer_id: str
    currency: str
    amount_captured: Money
    amount_refunded: Money
    status: str
    refundable: Money = Field(description="what policy would allow refunding now")


class OrderPage(View):
    items: list[OrderView]
    next_cursor: str | None


class ApprovalRequestView(View):
    """What a person is (or was) asked to approve."""

    refund_id: str
    amount: Money
    currency: str
    reason: str
    requested_at: Timestamp
    escalate_at: Timestamp
    expires_at: Timestamp
    escalated_at: Timestamp | None


class TimerView(View):
    """One of the refund's timer workflows (the deadline, the reminder to escalate)."""

    workflow_id: str
    status: str = Field(description="the DBOS workflow status: DELAYED while it waits")
    due_at: Timestamp | None


class ApprovalView(View):
    """A refund's approval: the request, and the decision once one is recorded."""

    request: ApprovalRequestView | None = Field(description="what was asked; pending while `decision` is null")
    decision: Literal["approve", "reject", "expired"] | None
    approved_amount: Money | None = Field(
        description="what was approved, in the request's currency (at most the request's amount); null unless approved"
    )
    approver: str | None
    via: str | None = Field(description="console, link, api, cli, slack:<team>/<user> or deadline")
    decided_at: Timestamp | None
    deadline: TimerView | None
    escalation: TimerView | None
    token: str | None = Field(default=None, description="only for a client that may decide this refund")
    approve_url: str | None = Field(default=None, description="only for a client that may decide this refund")
    reject_url: str | None = Field(default=None, description="only for a client that may decide this refund")


class AnswerFileView(View):
    """A file sent with the answer: described, never served."""

    content_type: str
    size: int = Field(description="bytes")
    sha256: str = Field(description="of an uploaded file's bytes; empty for a help desk's attachment (referenced)")


QuestionStateField = Annotated[
    Literal["open", "answered", "expired", "ended", "to_person"],
    Field(
        description="open: waiting for the customer; answered: judged again with the answer; expired: unanswered by "
        "the deadline, closed unpaid; ended: a support lead ended the wait, closed unpaid; to_person: a support lead "
        "sent it to a person before the customer answered"
    ),
]


class QuestionView(View):
    """What the refund asked its customer (policy asks where only the customer can close a gap) and what came of it."""

    kind: Literal["delivery", "photo", "return_tracking"] = Field(
        description="delivery: confirm a parcel shown delivered never came; photo: of the item; return_tracking: the "
        "return's tracking number"
    )
    state: QuestionStateField
    asked_at: Timestamp
    remind_at: Timestamp
    expires_at: Timestamp = Field(description="the deadline: unanswered by then, the refund is closed unpaid")
    reminded_at: Timestamp | None
    answered_at: Timestamp | None
    answered_via: str | None = Field(description="link, or helpdesk:<comment id>")
    files: list[AnswerFileView]
    reminder: TimerView | None
    deadline: TimerView | None


class Cost(View):
    amount: Money
    currency: str


class UsageView(View):
    model: str | None
    requests: int
    input_tokens: int | None
    output_tokens: int | None
    cost: Cost | None = Field(description="with a price configured for the model")


class PaymentView(View):
    provider_refund_id: str | None
    idempotency_key: str | None
    provider_status: str | None
    failure_reason: str | None


class Outcome(View):
    """The result of the workflow run that ended the refund."""

    refund_id: str
    status: str
    amount: Money | None = None
    currency: str | None = None
    provider_refund_id: str | None = None
    idempotency_key: str | None = None
    model: str | None = None
    detail: str | None = Field(default=None, description="why it was refused or failed")
    workflow: str | None = Field(default=None, description="the DBOS status of a run that ended without a result")


class WorkflowView(View):
    workflow_id: str
    name: str | None
    status: str
    created_at: Timestamp | None
    due_at: Timestamp | None
    executor_id: str | None
    app_version: str | None


class StepView(View):
    workflow: str
    step: int
    name: str
    start: Timestamp | None
    end: Timestamp | None
    duration_ms: int | None
    error: str | None


class SentMessage(View):
    text: str
    """The message, as sent."""
    sent_at: Timestamp
    """When it was written to the outbox: with the refund's outcome, or when the refund was parked for a person."""
    about: Literal["outcome", "waiting", "question", "reminder"]
    """``outcome``: how the refund ended (paid, refused, rejected, expired); ``waiting``: that a person must confirm
    it, and by when the customer hears from us again; ``question``: what the customer must send, where and by when;
    ``reminder``: the one reminder of that question."""
    delivery: Literal["pending", "sending", "sent", "failed"]
    """Its email: ``pending`` (not sent yet: no SMTP server is configured, or it waits to be retried), ``sending``,
    ``sent`` or ``failed`` (attempts ran out, or the address was refused)."""


class RefundView(View):
    """One refund: phase, amounts, approval, payment, outcome and the DBOS step timeline."""

    refund_id: str
    status: Status
    order_id: str | None
    requested_by: str | None
    requester_operator: str | None
    amount: DecidedAmount
    amount_requested: AmountRequested
    amount_refunded: AmountRefunded
    currency: str | None
    verdict: str | None
    reason: str | None
    customer_reply: str | None
    """The model's draft reply; sent only when it fits a refund paid at once (what was sent: ``customer_message``)."""
    customer_message: SentMessage | None
    """The last message the customer was sent: about the outcome once the refund ended, before that about its
    waiting for a person; null before any (nothing is sent while a refund is decided, paid or settled)."""
    model: str | None
    claim: ClaimView
    """The claim's category and the evidence the agent looked up (ticket comments never: customer data)."""
    usage: UsageView | None
    approval: ApprovalView | None
    question: QuestionView | None
    """The question the refund asked its customer, if it asked one."""
    payment: PaymentView
    outcome: Outcome | None
    executor_id: str | None
    workflows: list[WorkflowView]
    steps: list[StepView]


class DecisionView(View):
    """The recorded decision (first writer wins)."""

    refund_id: str
    decision: Literal["approve", "reject", "expired"]
    approver: str
    amount: Money
    currency: str
    decided_at: Timestamp
    note: str
    via: str
    first: bool = Field(description="false when this repeats a decision recorded earlier")


class TurnView(View):
    """One message between the refund and its customer. ``text`` is plain text as written: render it escaped."""

    at: Timestamp
    speaker: Literal["customer", "agent"] = Field(description="who wrote it: the customer, or the refund agent")
    channel: str = Field(
        description="how it travelled: `api` (the request a client submitted), `helpdesk` (the ticket), `email`, "
        "`link` (the customer's signed answer link)"
    )
    about: str = Field(
        description="what it is: `request`; `comment` (the customer's reply on the ticket); `answer` (their answer to "
        "the refund's question, on the ticket or through its link, with what it added in `details`); or for a "
        "message to the customer `question`, `reminder`, `waiting` or `outcome`"
    )
    text: str
    delivery: Literal["pending", "sending", "sent", "failed"] | None = Field(
        description="a message to the customer: how far its delivery got; null for the customer's own"
    )
    details: list[str] = Field(description="what the message carried besides its text, e.g. the help desk's comment id")


class AskedView(View):
    """What the refund asked its customer and the wait for their answer."""

    kind: Literal["delivery", "photo", "return_tracking"]
    state: QuestionStateField
    asked_at: Timestamp
    remind_at: Timestamp = Field(description="when the customer is reminded, unless they answered before")
    reminded_at: Timestamp | None
    deadline: Timestamp = Field(description="unanswered by then, the refund is closed unpaid and the customer told")
    answered_at: Timestamp | None


class ConversationView(View):
    """A refund's conversation with its customer, oldest first. Messages to approvers are not part of it."""

    refund_id: str
    ticket_id: str | None = Field(description="the help-desk ticket the refund came from; null for one from the API")
    question: AskedView | None = Field(description="what the refund asked its customer; null when it asked nothing")
    turns: list[TurnView]

    @classmethod
    def of(cls, found: Conversation) -> ConversationView:
        q = found.question
        asked = None
        if q is not None:
            asked = AskedView(
                kind=q.question, state=q.state, asked_at=q.asked_at, remind_at=q.remind_at, reminded_at=q.reminded_at,
                deadline=q.expires_at, answered_at=q.answered_at,
            )  # fmt: skip
        return cls(
            refund_id=found.refund_id,
            ticket_id=found.ticket_id,
            question=asked,
            turns=[TurnView.model_validate({**asdict(t), "details": list(t.details)}) for t in found.turns],
        )


class WaitMoveView(View):
    """A support lead's move on a refund's wait for its customer, as recorded."""

    refund_id: str
    move: Literal["end", "person"]
    question_state: Literal["ended", "to_person"]
    by: str = Field(description="the client that moved it (its principal)")


class Readiness(View):
    ok: bool
    checks: dict[str, bool] = Field(description="app_database, system_database, dbos_launched")


def as_view(model: type[View], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as the response model answers it (timestamps in UTC with ``Z``)."""
    return model.model_validate(data).model_dump(mode="json")
