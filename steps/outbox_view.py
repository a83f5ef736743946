"""What operators see of the outbox: each message's way out (channel, recipient, delivery state), never its body.

An approver's message carries a signed decision link, a credential for whoever reads it; so no view of the outbox
shows a body, only where the message went, how it fared and the error that stopped it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from steps.store import outbox, utc

#: The most failed messages the console lists at once (the count is exact).
FAILED_SHOWN = 20


@dataclass(frozen=True)
class Delivery:
    refund_id: str
    channel: str
    recipient: str
    state: str  # pending | sending | sent | failed
    attempts: int
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None


def _rows(conn: sa.Connection, query: sa.Select[tuple[object, ...]]) -> list[Delivery]:
    c = outbox.c
    return [
        Delivery(
            r.refund_id,
            r.channel,
            r.recipient,
            r.delivery_state,
            int(r.attempts),
            r.last_error,
            utc(r.created_at),
            utc(r.sent_at) if r.sent_at is not None else None,
        )
        for r in conn.execute(
            query.with_only_columns(
                c.refund_id, c.channel, c.recipient, c.delivery_state, c.attempts, c.last_error, c.created_at, c.sent_at
            )
        )
    ]


def deliveries(conn: sa.Connection, refund_id: str) -> list[Delivery]:
    """The refund's messages, oldest first."""
    return _rows(conn, sa.select(outbox).where(outbox.c.refund_id == refund_id).order_by(outbox.c.id))


def failed(conn: sa.Connection, limit: int = FAILED_SHOWN) -> tuple[int, list[Delivery]]:
    """How many messages failed for good, and the latest ``limit`` of them."""
    count = conn.execute(
        sa.select(sa.func.count()).select_from(outbox).where(outbox.c.delivery_state == "failed")
    ).scalar_one()
    latest = _rows(
        conn, sa.select(outbox).where(outbox.c.delivery_state == "failed").order_by(outbox.c.id.desc()).limit(limit)
    )
    return int(count), latest
