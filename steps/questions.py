"""A refund's question to its customer: asked with the verdict, answered once or expired once, reminded once.

``state`` moves once, from ``open`` to ``answered`` or ``expired``, each by an update guarded on ``state = 'open'``:
an answer racing the deadline ends exactly one way, as a decision racing an approval's deadline does
(steps/approval_book.py). Every write also appends to the audit log; the customer's words are kept in the question's
row, and only their SHA-256 in the audit. ``Question`` and ``AnswerOutcome`` stay in this module: checkpoints name a
record's module and class (agent/ops/checkpoints.py).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa

from steps import audit
from steps.evidence import AnswerFile, CustomerAnswer, QuestionKind
from steps.notify import CustomerMessage, customer_of, queue_customer_message
from steps.records import ModelUsage, Record
from steps.refunds import record_outcome, record_verdict, touch
from steps.store import (
    customer_answer_files,
    customer_questions,
    insert_if_absent,
    read_step,
    session,
    transaction,
    utc,
)

#: ``ended`` and ``to_person``: a support lead ended the wait (closed unpaid) or sent the refund to a person.
QuestionState = Literal["open", "answered", "expired", "ended", "to_person"]
LeadMove = Literal["ended", "to_person"]
#: What became of an answer: ``recorded`` (this one is the answer), ``duplicate`` (this same delivery was recorded
#: before), ``answered`` (another answer was), ``expired`` (the deadline passed), ``not_asked`` (no open question).
AnswerResult = Literal["recorded", "duplicate", "answered", "expired", "not_asked"]


class Question(Record):
    refund_id: str
    question: QuestionKind
    asked_at: datetime
    remind_at: datetime
    expires_at: datetime
    reminded_at: datetime | None = None
    state: QuestionState = "open"
    answered_at: datetime | None = None
    answer: CustomerAnswer | None = None


class AnswerOutcome(Record):
    refund_id: str
    result: AnswerResult
    question: Question | None = None
    key: str = ""
    """What delivered the answer that stands (the one recorded, or this one's when it was refused)."""


class QuestionCase(Record):
    """What the refund is judged again on: the question with its answer, and the request and proposal it asked on."""

    question: Question
    case_file: dict[str, Any]


def _question(row: Any) -> Question:
    return Question(
        refund_id=row.refund_id,
        question=row.question,
        asked_at=utc(row.asked_at),
        remind_at=utc(row.remind_at),
        expires_at=utc(row.expires_at),
        reminded_at=utc(row.reminded_at) if row.reminded_at else None,
        state=row.state,
        answered_at=utc(row.answered_at) if row.answered_at else None,
        answer=CustomerAnswer.model_validate(row.answer) if row.answer else None,
    )


def question_of(conn: sa.Connection | Any, refund_id: str, *, lock: bool = False) -> Question | None:
    """The question a refund asked (or asks), if any."""
    query = sa.select(customer_questions).where(customer_questions.c.refund_id == refund_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return _question(row) if row is not None else None


@transaction("questions.open")
def open_question_step(
    refund_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None = None,
    evidence: dict[str, Any] | None = None,
    question: QuestionKind,
    case_file: dict[str, Any],
    remind_after: float,
    timeout: float,
) -> Question:
    """Record the verdict and the question it asks, together; the refund waits for its customer from here on.

    A fork that runs this step again keeps the first question (and its deadlines)."""
    now = datetime.now(UTC)
    record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    values = {
        "refund_id": refund_id,
        "question": question,
        "asked_at": now,
        "remind_at": now + timedelta(seconds=min(remind_after, timeout)),
        "expires_at": now + timedelta(seconds=timeout),
        "state": "open",
        "case_file": case_file,
    }
    insert_if_absent(session(), customer_questions, values)
    asked = question_of(session(), refund_id)
    assert asked is not None
    touch(refund_id, now, status="awaiting_customer")
    window = {
        "question": asked.question,
        "asked_at": asked.asked_at.isoformat(),
        "expires_at": asked.expires_at.isoformat(),
    }
    audit.append(session(), refund_id=refund_id, event="customer_asked", payload=window, now=now)
    return asked


@transaction("notify.customer_question")
def ask_customer_step(refund_id: str, *, text: str) -> None:
    """Tell the customer what is needed and by when (once per refund)."""
    queue_customer_message(refund_id, CustomerMessage(customer_of(refund_id), text), about="question")


def _described(answer: CustomerAnswer) -> dict[str, Any]:
    """The audit's record of an answer: what it is, never the customer's words (their SHA-256 only)."""
    return {
        "question": answer.question,
        "via": answer.via,
        "text_sha256": hashlib.sha256(answer.text.encode()).hexdigest(),
        "received": answer.received,
        "tracking_number": bool(answer.tracking_number),
        "files": [{"content_type": f.content_type, "size": f.size, "sha256": f.sha256} for f in answer.files],
    }


@transaction("questions.record_answer")
def record_answer_step(refund_id: str, answer: CustomerAnswer, *, key: str) -> AnswerOutcome:
    """The customer's answer, once: the first one while the question is open and before its deadline is recorded
    (the refund is deciding again); any other gets what stands."""
    now = datetime.now(UTC)
    asked = question_of(session(), refund_id, lock=True)
    if asked is None:
        return AnswerOutcome(refund_id=refund_id, result="not_asked")
    c = customer_questions.c
    if asked.state == "open" and now < asked.expires_at:
        recorded = answer.model_copy(update={"answered_at": now})
        done = session().execute(
            customer_questions.update()
            .where(c.refund_id == refund_id, c.state == "open")
            .values(state="answered", answered_at=now, answer=recorded.model_dump(mode="json"), answer_key=key)
        )
        if done.rowcount == 1:  # type: ignore[attr-defined]
            touch(refund_id, now, status="deciding")
            audit.append(
                session(), refund_id=refund_id, event="customer_answered", payload=_described(recorded), now=now
            )
            standing = question_of(session(), refund_id)
            return AnswerOutcome(refund_id=refund_id, result="recorded", question=standing, key=key)
        asked = question_of(session(), refund_id)
        assert asked is not None
    if asked.state == "answered":
        first = session().execute(sa.select(c.answer_key).where(c.refund_id == refund_id)).scalar_one()
        result: AnswerResult = "duplicate" if first == key else "answered"
        return AnswerOutcome(refund_id=refund_id, result=result, question=asked, key=first or "")
    return AnswerOutcome(refund_id=refund_id, result="expired", question=asked, key=key)


@transaction("questions.expire")
def expire_question_step(refund_id: str, *, detail: str, reply: str) -> QuestionState | None:
    """At the deadline: with no answer, the question expires and the refund ends rejected, its customer told why, in
    this one transaction; an answer that won the race stands. Returns the state that stands."""
    now = datetime.now(UTC)
    c = customer_questions.c
    done = session().execute(
        customer_questions.update().where(c.refund_id == refund_id, c.state == "open").values(state="expired")
    )
    if done.rowcount == 1:  # type: ignore[attr-defined]
        audit.append(session(), refund_id=refund_id, event="customer_question_expired", payload={}, now=now)
        record_outcome(refund_id, now, status="rejected", detail=detail, reply=reply)
        return "expired"
    asked = question_of(session(), refund_id)
    return asked.state if asked is not None else None


@transaction("questions.lead")
def lead_step(refund_id: str, *, move: LeadMove, operator: str, detail: str, reply: str) -> QuestionState | None:
    """A support lead ends the customer's wait: ``ended`` closes the refund rejected (the customer told why, in this
    transaction), ``to_person`` sends it to be judged for a person. Only an open question moves, so a lead racing
    the customer's answer or the deadline ends it exactly one way. Returns the state that stands."""
    now = datetime.now(UTC)
    c = customer_questions.c
    done = session().execute(
        customer_questions.update().where(c.refund_id == refund_id, c.state == "open").values(state=move)
    )
    if done.rowcount == 1:  # type: ignore[attr-defined]
        event = "customer_wait_ended" if move == "ended" else "customer_wait_to_person"
        audit.append(session(), refund_id=refund_id, event=event, payload={"operator": operator}, now=now)
        if move == "ended":
            record_outcome(refund_id, now, status="rejected", detail=detail, reply=reply)
        else:
            touch(refund_id, now, status="deciding")
        return move
    asked = question_of(session(), refund_id)
    return asked.state if asked is not None else None


@transaction("questions.remind")
def remind_question_step(refund_id: str, *, text: str) -> bool:
    """Remind the customer once, unless they answered or the question expired meanwhile; True when queued."""
    now = datetime.now(UTC)
    c = customer_questions.c
    done = session().execute(
        customer_questions.update()
        .where(c.refund_id == refund_id, c.state == "open", c.reminded_at.is_(None))
        .values(reminded_at=now)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return False
    queue_customer_message(refund_id, CustomerMessage(customer_of(refund_id), text), about="reminder")
    audit.append(session(), refund_id=refund_id, event="customer_reminded", payload={}, now=now)
    return True


@read_step("questions.read_case")
def question_case_step(conn: sa.Connection, refund_id: str) -> QuestionCase | None:
    """The answered question and the case it was asked on, for the refund's second judgement."""
    asked = question_of(conn, refund_id)
    if asked is None:
        return None
    case_file = conn.execute(
        sa.select(customer_questions.c.case_file).where(customer_questions.c.refund_id == refund_id)
    ).scalar_one()
    return QuestionCase(question=asked, case_file=dict(case_file))


@read_step("questions.read_lead")
def lead_of_step(conn: sa.Connection, refund_id: str) -> str | None:
    """The support lead who sent the refund to a person before its customer answered, from the audit log."""
    moved = [e for e in audit.entries(conn, refund_id) if e.event == "customer_wait_to_person"]
    return str(moved[-1].payload.get("operator")) if moved else None


def store_file(engine: sa.Engine, refund_id: str, *, name: str, content_type: str, content: bytes) -> AnswerFile:
    """Keep a file a customer uploaded with an answer (once per refund and content); its description for the answer.
    A plain transaction: the answer link stores it before the answer is recorded."""
    digest = hashlib.sha256(content).hexdigest()
    values = {
        "refund_id": refund_id,
        "sha256": digest,
        "name": name[:200],
        "content_type": content_type,
        "size": len(content),
        "content": content,
        "received_at": datetime.now(UTC),
    }
    with engine.begin() as conn:
        insert_if_absent(conn, customer_answer_files, values)
    return AnswerFile(name=name[:200], content_type=content_type, size=len(content), sha256=digest, stored=True)


def files_of(conn: sa.Connection, refund_id: str) -> list[AnswerFile]:
    """The files kept for a refund's answer (described; their bytes are never read back out through the API)."""
    f = customer_answer_files.c
    rows = conn.execute(
        sa.select(f.name, f.content_type, f.size, f.sha256).where(f.refund_id == refund_id).order_by(f.received_at)
    )
    return [
        AnswerFile(name=r.name, content_type=r.content_type, size=r.size, sha256=r.sha256, stored=True) for r in rows
    ]
