"""The workflows around a refund's question to its customer: asking, the reminder and the deadline, and the answer.

None of them waits. Asking records the question and tells the customer in two steps, then the refund's workflow
ends; the reminder and the deadline are DELAYED rows until due (version-less, on the approvals queue, behind
decisions, exactly like an approval's timers); the answer workflow (``{refund_id}/answer``) records the answer once
and enqueues the second judgement (``{refund_id}/rejudge``, agent/rejudge.py), then ends the timers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from dbos import DBOS, EnqueueOptions, SetWorkflowID

from agent import replies
from agent.approval_workflows import enqueue_timer, finish_timers_step
from agent.approvals import APPROVAL_QUEUE
from agent.context import Runtime, current
from agent.domain import Phase, RefundProposal, RefundRequest, Verdict
from agent.ops.offloop import call
from agent.questions import (
    ANSWER_WORKFLOW,
    ENDED_DETAIL,
    EXPIRED_DETAIL,
    EXPIRY_WORKFLOW,
    LEAD_WORKFLOW,
    QUESTION_TIMERS,
    REJUDGE_WORKFLOW,
    REMINDER_WORKFLOW,
    answer_id,
    answer_link,
    expiry_id,
    lead_id,
    rejudge_id,
    reminder_id,
)
from steps.evidence import CustomerAnswer, QuestionKind
from steps.faults import crash_point
from steps.questions import (
    AnswerOutcome,
    LeadMove,
    Question,
    ask_customer_step,
    expire_question_step,
    lead_step,
    open_question_step,
    question_of,
    record_answer_step,
    remind_question_step,
)
from steps.store import app_db

#: A lead's moves on a wait as the console's form and the API name them -> the question's state each leaves.
LEAD_MOVES: dict[str, LeadMove] = {"end": "ended", "person": "to_person"}


def link_for(rt: Runtime, refund_id: str, question: str, expires_at: datetime) -> str:
    return answer_link(rt.approvals.public_url, rt.approvals.signing_secret, refund_id, question, expires_at)


async def ask_customer(
    rt: Runtime,
    refund_id: str,
    req: RefundRequest,
    verdict: Verdict,
    proposal: RefundProposal,
    record: dict[str, Any],
    *,
    requested: Decimal | None,
) -> dict[str, Any]:
    """Record the verdict and its question (one step), set the reminder and the deadline, tell the customer what is
    needed, where to answer and by when (one step); then end: waiting is rows."""
    assert verdict.question is not None
    config = rt.settings.questions
    case_file = {
        "request": req.model_dump(mode="json"),
        "proposal": proposal.model_dump(mode="json"),
        "requested": str(requested) if requested is not None else None,
    }
    asked = await call(
        open_question_step,
        refund_id,
        **record,
        question=verdict.question,
        case_file=case_file,
        remind_after=config.reminder_after_seconds,
        timeout=config.answer_timeout_seconds,
    )
    crash_point("after_question_recorded")
    await start_question_timers(asked)
    link = link_for(rt, refund_id, asked.question, asked.expires_at)
    await call(ask_customer_step, refund_id, text=replies.asked(asked.question, link, asked.expires_at))
    return {
        "refund_id": refund_id,
        "status": Phase.AWAITING_CUSTOMER.value,
        "question": asked.question,
        "expires_at": asked.expires_at.isoformat(),
    }


async def start_question_timers(asked: Question) -> None:
    """The deadline (and the reminder before it) as DELAYED workflows; delays from the recorded question, so a
    replay computes the same ones."""
    refund_id, expires = asked.refund_id, asked.expires_at.isoformat()
    expires_in = (asked.expires_at - asked.asked_at).total_seconds()
    await enqueue_timer(EXPIRY_WORKFLOW, expiry_id(refund_id), refund_id, asked.question, delay=expires_in)
    reminds_in = (asked.remind_at - asked.asked_at).total_seconds()
    if reminds_in < expires_in:
        await enqueue_timer(
            REMINDER_WORKFLOW, reminder_id(refund_id), refund_id, asked.question, expires, delay=reminds_in
        )


@DBOS.workflow(name=ANSWER_WORKFLOW)
def customer_answer_workflow(refund_id: str, answer: dict[str, Any], key: str) -> dict[str, Any]:
    """The customer's answer: recorded once (while the question is open), then handed to the second judgement."""
    outcome = record_answer_step(refund_id, CustomerAnswer.model_validate(answer), key=key)
    crash_point("after_answer_recorded")
    if outcome.result == "recorded":
        _rejudge(refund_id)
        finish_timers_step(refund_id, QUESTION_TIMERS)  # answered: the reminder and the deadline end now
    return outcome.model_dump(mode="json")


@DBOS.workflow(name=REMINDER_WORKFLOW)
def customer_question_reminder_workflow(refund_id: str, question: QuestionKind, expires_at: str) -> bool:
    """Due at the reminder time: remind the customer once, unless they answered or the question expired."""
    by = datetime.fromisoformat(expires_at)
    link = link_for(current(), refund_id, question, by)
    return remind_question_step(refund_id, text=replies.reminded(question, link, by))


@DBOS.workflow(name=EXPIRY_WORKFLOW)
def customer_question_expiry_workflow(refund_id: str, question: QuestionKind) -> dict[str, Any] | None:
    """Due at the question's deadline: unanswered, the refund ends rejected and the customer is told why; an answer
    that won the race stands (its judgement runs)."""
    state = expire_question_step(refund_id, detail=EXPIRED_DETAIL, reply=replies.unanswered(question))
    if state != "expired":
        return None
    finish_timers_step(refund_id, [REMINDER_WORKFLOW])  # a reminder still waiting ends with the refund
    return {"refund_id": refund_id, "status": Phase.REJECTED.value, "detail": EXPIRED_DETAIL}


def _rejudge(refund_id: str) -> None:
    options: EnqueueOptions = {
        "queue_name": APPROVAL_QUEUE,
        "workflow_name": REJUDGE_WORKFLOW,
        "workflow_id": rejudge_id(refund_id),
    }
    DBOS.enqueue_workflow_with_options(options, refund_id)


@DBOS.workflow(name=LEAD_WORKFLOW)
def customer_wait_lead_workflow(
    refund_id: str, move: LeadMove, operator: str, question: QuestionKind
) -> dict[str, Any]:
    """A support lead's move on a customer's wait (once per refund): ``ended`` closes it unpaid with the customer
    told; ``to_person`` has the refund judged again for a person to decide. Either ends the reminder and deadline."""
    reply = replies.wait_ended(question)
    state = lead_step(
        refund_id, move=move, operator=operator, detail=ENDED_DETAIL.format(operator=operator), reply=reply
    )
    if state != move:  # the customer answered, the deadline passed, or the wait was not open
        return {"refund_id": refund_id, "move": move, "done": False, "state": state}
    if move == "to_person":
        _rejudge(refund_id)
    finish_timers_step(refund_id, QUESTION_TIMERS)
    return {"refund_id": refund_id, "move": move, "done": True, "state": state, "operator": operator}


def lead_here(refund_id: str, move: LeadMove, operator: str, question: QuestionKind) -> dict[str, Any]:
    """Run a lead's move on the wait in this process (DBOS launched here); a second move, by anyone, meets the
    first's run under the refund's id and gets its result."""
    with SetWorkflowID(lead_id(refund_id)):
        handle = DBOS.start_workflow(customer_wait_lead_workflow, refund_id, move, operator, question)
    result: dict[str, Any] = handle.get_result()
    return result


@dataclass(frozen=True)
class WaitMove:
    """What a lead's move on a wait came to: ``done``, or the question's state that stands instead (answered,
    expired, or moved before)."""

    done: bool
    state: str


def move_wait_here(refund_id: str, move: str, operator: str) -> WaitMove | None:
    """A lead's move (a key of ``LEAD_MOVES``) on the refund's wait for its customer, run here if the question is
    still open; None when the refund asked its customer nothing. The console and the API both act through this."""
    with app_db().engine.connect() as conn:
        asked = question_of(conn, refund_id)
    if asked is None:
        return None
    if asked.state != "open":
        return WaitMove(done=False, state=asked.state)
    result = lead_here(refund_id, LEAD_MOVES[move], operator, asked.question)
    return WaitMove(done=bool(result["done"]), state=str(result["state"]))


def answer_here(refund_id: str, answer: CustomerAnswer, *, key: str) -> AnswerOutcome:
    """Run the refund's answer workflow in this process (DBOS launched here) and return what stands: concurrent and
    repeated calls meet the one run under the refund's answer id and get its result."""
    with SetWorkflowID(answer_id(refund_id)):
        handle = DBOS.start_workflow(customer_answer_workflow, refund_id, answer.model_dump(mode="json"), key)
    return AnswerOutcome.model_validate(handle.get_result())
