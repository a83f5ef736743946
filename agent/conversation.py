"""A refund's conversation with its customer, oldest first: their request, what they were told, what they wrote back.

Read from the workflow's input (the request: the app database keeps only its hash), the outbox (every message to the
customer, with how far its delivery got), the help desk's comments on the refund's ticket and the refund's question
to its customer with the answer and what it added as evidence. Approvers' messages are not part of it: they carry
signed decision links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import sqlalchemy as sa
from dbos import DBOSClient

from steps.evidence import AnswerFile, CustomerAnswer
from steps.helpdesk_inbox import conversation as ticket_comments
from steps.helpdesk_inbox import ticket_refunds
from steps.questions import Question, question_of
from steps.store import helpdesk_tickets, outbox, refunds, utc

Speaker = Literal["customer", "agent"]


@dataclass(frozen=True)
class Turn:
    """One message of the conversation. ``text`` is plain text as written: shown escaped, never as markup."""

    at: datetime
    speaker: Speaker
    channel: str  # api | helpdesk | email
    about: str  # request | comment | outcome | waiting | ...: what the message is
    text: str
    delivery: str | None = None  # a message to the customer: pending | sending | sent | failed
    details: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Conversation:
    refund_id: str
    ticket_id: str | None
    turns: list[Turn]
    question: Question | None = None
    """What the refund asked its customer, when, and by when they may answer (its state says how it ended)."""


def request_messages(client: DBOSClient, refund_ids: list[str]) -> dict[str, str]:
    """The customers' own words, from the workflows' inputs (the app database keeps only a hash)."""
    if not refund_ids:
        return {}
    found = {}
    for wf in client.list_workflows(workflow_ids=refund_ids, load_input=True, load_output=False):
        args = wf.input["args"] if wf.input else ()
        if len(args) > 1 and isinstance(args[1], dict):
            found[wf.workflow_id] = str(args[1].get("message", ""))
    return found


def _about(refund_id: str, message_key: str) -> str:
    """What a customer message is about, from its key: ``{refund}:customer`` (the outcome) or
    ``{refund}:customer:{about}``."""
    rest = message_key.removeprefix(f"{refund_id}:customer")
    return rest.removeprefix(":") or "outcome"


def conversation(conn: sa.Connection, client: DBOSClient, refund_id: str) -> Conversation | None:
    """The refund's conversation; None when there is no such refund."""
    row = conn.execute(
        sa.select(refunds.c.created_at, refunds.c.requested_by).where(refunds.c.refund_id == refund_id)
    ).first()
    if row is None:
        return None
    ticket_id = conn.execute(
        sa.select(helpdesk_tickets.c.ticket_id).join(refunds, ticket_refunds()).where(refunds.c.refund_id == refund_id)
    ).scalar_one_or_none()
    way_in = "helpdesk" if ticket_id is not None else "api"
    way_out = "helpdesk" if ticket_id is not None else "email"
    turns = [
        Turn(utc(row.created_at), "customer", way_in, "request", text)
        for text in request_messages(client, [refund_id]).values()
    ]
    sent = conn.execute(
        sa.select(outbox.c.message_key, outbox.c.body, outbox.c.created_at, outbox.c.delivery_state)
        .where(outbox.c.refund_id == refund_id, outbox.c.message_key.startswith(f"{refund_id}:customer"))
        .order_by(outbox.c.id)
    )
    turns += [
        Turn(utc(m.created_at), "agent", way_out, _about(refund_id, m.message_key), m.body, delivery=m.delivery_state)
        for m in sent
    ]
    asked = question_of(conn, refund_id)
    answer = asked.answer if asked is not None else None
    answered_on_ticket = answer.via.removeprefix("helpdesk:") if answer and answer.via.startswith("helpdesk:") else None
    for c in ticket_comments(conn, refund_id):
        if c.comment_id == answered_on_ticket and answer is not None:
            details = (f"comment {c.comment_id}", *added(answer))
            turns.append(Turn(utc(c.created_at), "customer", "helpdesk", "answer", c.body, details=details))
        else:
            turns.append(
                Turn(utc(c.created_at), "customer", "helpdesk", "comment", c.body, details=(f"comment {c.comment_id}",))
            )
    if answer is not None and answered_on_ticket is None:  # through the signed link
        at = answer.answered_at or (asked.answered_at if asked else None) or utc(row.created_at)
        turns.append(Turn(utc(at), "customer", answer.via or "link", "answer", answer.text, details=added(answer)))
    turns.sort(key=lambda t: t.at)  # stable: a request and its first reply keep their order within one instant
    return Conversation(refund_id, ticket_id, turns, asked)


def _file(f: AnswerFile) -> str:
    kind = "image" if f.image else "file, not an image"
    where = f"kept, sha256 {f.sha256[:12]}" if f.stored else f"referenced at {f.url}" if f.url else "not kept"
    name = f" {f.name!r}" if f.name else ""
    return f"{kind}{name}: {f.content_type}, {f.size} bytes ({where})"


def added(answer: CustomerAnswer) -> tuple[str, ...]:
    """What the answer added to the evidence, one line each, as the second judgement read it."""
    lines = []
    if answer.received is not None:
        lines.append("says the parcel arrived" if answer.received else "says the parcel still has not arrived")
    if answer.tracking_number:
        lines.append(f"return tracking number {answer.tracking_number}")
    lines += [_file(f) for f in answer.files]
    if not lines:
        lines.append("no photo, number or choice: their words only")
    return tuple(lines)
