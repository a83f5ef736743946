"""A refund's conversation with its customer, oldest first: their request, what they were told, what they wrote back.

Read from the workflow's input (the request: the app database keeps only its hash), the outbox (every message to the
customer, with how far its delivery got) and the help desk's comments on the refund's ticket. Approvers' messages are
not part of it: they carry signed decision links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import sqlalchemy as sa
from dbos import DBOSClient

from steps.helpdesk_inbox import conversation as ticket_comments
from steps.helpdesk_inbox import ticket_refunds
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
    turns += [
        Turn(utc(c.created_at), "customer", "helpdesk", "comment", c.body, details=(f"comment {c.comment_id}",))
        for c in ticket_comments(conn, refund_id)
    ]
    turns.sort(key=lambda t: t.at)  # stable: a request and its first reply keep their order within one instant
    return Conversation(refund_id, ticket_id, turns)
