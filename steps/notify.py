"""Notifications to approvers and customers, written to the outbox exactly once."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import sqlalchemy as sa

from steps.store import outbox, session, transaction

log = logging.getLogger(__name__)


def _queue(message_key: str, refund_id: str, channel: str, recipient: str, body: str) -> None:
    session().execute(
        outbox.insert().values(
            message_key=message_key,
            refund_id=refund_id,
            channel=channel,
            recipient=recipient,
            body=body,
            created_at=datetime.now(UTC),
        )
    )
    log.info("notification %s queued for refund %s via %s", message_key, refund_id, channel)


@transaction("notify.approvers")
def notify_approvers_step(refund_id: str, *, kind: str, text: str) -> None:
    """Ask approvers for a decision (``kind`` is ``request`` or ``escalation``)."""
    _queue(f"{refund_id}:approvers:{kind}", refund_id, "approvers", "approvers", text)


@transaction("notify.customer")
def notify_customer_step(refund_id: str, *, customer_id: str, text: str) -> None:
    _queue(f"{refund_id}:customer", refund_id, "email", customer_id, text)


def messages(conn: sa.Connection, refund_id: str) -> list[dict[str, str]]:
    rows = conn.execute(sa.select(outbox).where(outbox.c.refund_id == refund_id).order_by(outbox.c.id))
    return [{"channel": r.channel, "recipient": r.recipient, "body": r.body} for r in rows]
