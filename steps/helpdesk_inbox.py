"""What the help desk's webhook records: each signed delivery once, the ticket a refund came from, customers' comments.

Plain transactions on the application database, not steps: the webhook runs outside any workflow, and each write is
made idempotent by its key (the delivery's signature, the ticket id, the comment id), so a retried request repeats it
harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from steps.store import helpdesk_comments, helpdesk_deliveries, helpdesk_tickets, insert_if_absent, refunds


@dataclass(frozen=True)
class TicketComment:
    """A comment the help desk reported on a ticket; ``body`` is plain text as sent (never rendered unescaped)."""

    comment_id: str
    ticket_id: str
    author_role: str
    body: str
    created_at: datetime


def delivered_before(engine: sa.Engine, signature: str) -> bool:
    """Whether a delivery with this signature was handled already (a replay of the same bytes)."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(helpdesk_deliveries.c.signature).where(helpdesk_deliveries.c.signature == signature)
        ).first()
    return found is not None


def record_delivery(engine: sa.Engine, *, signature: str, event_type: str, ticket_id: str | None, outcome: str) -> None:
    """Remember a handled delivery (once: a concurrent copy that got here first wins)."""
    values = {
        "signature": signature,
        "event_type": event_type[:100],
        "ticket_id": ticket_id,
        "outcome": outcome,
        "received_at": datetime.now(UTC),
    }
    with engine.begin() as conn:
        insert_if_absent(conn, helpdesk_deliveries, values)


def ticket_refunds() -> sa.ColumnElement[bool]:
    """How a ticket's link meets its refund: the same id, requested by the same principal. A refund some API client
    submitted under a ticket's refund id first (``POST /refunds`` with that key) is not the ticket's: the ticket's
    comments are not kept for it and its messages are not posted to the ticket."""
    return sa.and_(
        refunds.c.refund_id == helpdesk_tickets.c.refund_id, refunds.c.requested_by == helpdesk_tickets.c.requested_by
    )


def ticket_refund(engine: sa.Engine, ticket_id: str) -> str | None:
    """The refund a ticket started, once that refund exists (a link whose refund was refused at submission is not)."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(helpdesk_tickets.c.refund_id)
            .join(refunds, ticket_refunds())
            .where(helpdesk_tickets.c.ticket_id == ticket_id)
        ).scalar_one_or_none()
    return found


def link_ticket(engine: sa.Engine, *, ticket_id: str, refund_id: str, requested_by: str) -> None:
    """Tie a ticket to the refund it starts, before the refund is submitted: a crash between the two leaves a link
    the ticket's next delivery completes, never a refund whose replies would miss its ticket."""
    now = datetime.now(UTC)
    values = {"ticket_id": ticket_id, "refund_id": refund_id, "requested_by": requested_by, "created_at": now}
    with engine.begin() as conn:
        insert_if_absent(conn, helpdesk_tickets, values)


def record_comment(engine: sa.Engine, comment: TicketComment, *, refund_id: str) -> bool:
    """Keep a customer's comment on a refund's ticket; False when that comment id was recorded before."""
    values = {
        "comment_id": comment.comment_id,
        "ticket_id": comment.ticket_id,
        "refund_id": refund_id,
        "author_role": comment.author_role,
        "body": comment.body,
        "created_at": comment.created_at,
        "received_at": datetime.now(UTC),
    }
    with engine.begin() as conn:
        return insert_if_absent(conn, helpdesk_comments, values)


def conversation(conn: sa.Connection, refund_id: str) -> list[TicketComment]:
    """The customer's comments on the refund's ticket, oldest first."""
    c = helpdesk_comments.c
    rows = conn.execute(
        sa.select(c.comment_id, c.ticket_id, c.author_role, c.body, c.created_at)
        .where(c.refund_id == refund_id)
        .order_by(c.created_at, c.comment_id)
    )
    return [TicketComment(r.comment_id, r.ticket_id, r.author_role, r.body, r.created_at) for r in rows]
