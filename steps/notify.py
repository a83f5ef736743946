"""Notifications to approvers and customers, written to the outbox exactly once."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from dbos import DBOS
from slack_sdk.webhook import WebhookClient

from steps.store import insert_if_absent, orders, outbox, refunds, session, transaction, utc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotifyConfig:
    slack_webhook_url: str | None = None


_config = NotifyConfig()


def configure(config: NotifyConfig) -> None:
    global _config
    _config = config


def slack_enabled() -> bool:
    return _config.slack_webhook_url is not None


def _queue(message_key: str, refund_id: str, channel: str, recipient: str, body: str) -> None:
    values = {
        "message_key": message_key,
        "refund_id": refund_id,
        "channel": channel,
        "recipient": recipient,
        "body": body,
        "created_at": datetime.now(UTC),
    }
    # One message per key: a forked workflow that runs this step again does not tell anyone twice.
    if insert_if_absent(session(), outbox, values):
        log.info("notification %s queued for refund %s via %s", message_key, refund_id, channel)


def queue_approvers_messages(refund_id: str, *, kind: str, messages: Mapping[str, str]) -> int:
    """Ask each approver (operator name -> text with a link bound to them) for a decision, in the caller's
    transaction; ``kind`` is ``request`` or ``escalation``. The operator the refund's requesting client acts for
    gets none: a link reaching the requester would let it decide its own refund. Returns how many were queued."""
    requester = (
        session()
        .execute(sa.select(refunds.c.requester_operator).where(refunds.c.refund_id == refund_id))
        .scalar_one_or_none()
    )
    queued = 0
    for recipient, text in messages.items():
        if recipient == requester:
            continue
        _queue(f"{refund_id}:approvers:{kind}:{recipient}", refund_id, "approvers", recipient, text)
        queued += 1
    return queued


def queue_operator_alert(refund_id: str, *, kind: str, text: str) -> None:
    """Tell operators something needs them (e.g. a refund the provider failed), in the caller's transaction."""
    _queue(f"{refund_id}:operators:{kind}", refund_id, "operators", "operators", text)


@transaction("notify.approvers")
def notify_approvers_step(
    refund_id: str, *, kind: str, messages: Mapping[str, str], customer_text: str | None = None
) -> int:
    """Ask the approvers and, with ``customer_text``, tell the customer their refund waits for a person: both in
    one transaction, so a customer is never told of a request no approver was sent."""
    queued = queue_approvers_messages(refund_id, kind=kind, messages=messages)
    if customer_text is not None:
        queue_customer_message(refund_id, CustomerMessage(customer_of(refund_id), customer_text), about="waiting")
    return queued


@dataclass(frozen=True)
class CustomerMessage:
    customer_id: str
    text: str


#: What a customer message is about: the refund's outcome (one per refund), that it waits for a person, the question
#: it asks them (steps/questions.py) and the one reminder of it.
CustomerAbout = Literal["outcome", "waiting", "question", "reminder"]


def _customer_key(refund_id: str, about: CustomerAbout) -> str:
    return f"{refund_id}:customer" if about == "outcome" else f"{refund_id}:customer:{about}"


def customer_of(refund_id: str) -> str:
    """The refund's customer (through its order), in the caller's transaction; ``unknown`` without one."""
    customer = (
        session()
        .execute(
            sa.select(orders.c.customer_id)
            .join(refunds, refunds.c.order_id == orders.c.order_id)
            .where(refunds.c.refund_id == refund_id)
        )
        .scalar_one_or_none()
    )
    return customer or "unknown"


def queue_customer_message(refund_id: str, message: CustomerMessage, *, about: CustomerAbout = "outcome") -> None:
    """Queue a message to the refund's customer in the caller's transaction: at most one per refund and ``about``."""
    _queue(_customer_key(refund_id, about), refund_id, "email", message.customer_id, message.text)


def customer_message(conn: sa.Connection, refund_id: str) -> dict[str, str] | None:
    """The last message the refund's customer was sent, when, what it was about (the outcome once there is one,
    else the newest of its question, the reminder and that it waits for a person) and how far its email delivery
    got; None before any."""
    keys = {_customer_key(refund_id, about): about for about in ("outcome", "waiting", "question", "reminder")}
    rows = conn.execute(
        sa.select(outbox.c.message_key, outbox.c.body, outbox.c.created_at, outbox.c.delivery_state, outbox.c.id)
        .where(outbox.c.message_key.in_(list(keys)))
        .order_by(outbox.c.id)
    ).all()
    found = sorted(rows, key=lambda r: (keys[r.message_key] == "outcome", r.id))
    if not found:
        return None
    row = found[-1]
    sent_at = utc(row.created_at).isoformat()
    return {"text": row.body, "sent_at": sent_at, "about": keys[row.message_key], "delivery": row.delivery_state}


@transaction("notify.customer")
def notify_customer_step(refund_id: str, *, customer_id: str, text: str) -> None:
    queue_customer_message(refund_id, CustomerMessage(customer_id, text))


def messages(conn: sa.Connection, refund_id: str) -> list[dict[str, str]]:
    rows = conn.execute(sa.select(outbox).where(outbox.c.refund_id == refund_id).order_by(outbox.c.id))
    return [{"channel": r.channel, "recipient": r.recipient, "body": r.body} for r in rows]


def mrkdwn_escape(text: str) -> str:
    """Text for a Slack text field shown as written: ``&``, ``<`` and ``>`` escaped as Slack requires, so nothing in
    it (the agent's reason, which a customer can steer) becomes a link, a mention (``<!channel>``) or a label."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def verbatim(text: str) -> dict[str, Any]:
    """A Block Kit text object that Slack shows as written: plain text (no ``*bold*``, no auto-linked URL, channel
    or mention), escaped, with no emoji codes turned into pictures."""
    return {"type": "plain_text", "text": mrkdwn_escape(text), "emoji": False}


def slack_message(text: str, blocks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A webhook message whose text a customer or the model may have steered: sent verbatim (no mrkdwn in the
    fallback ``text``, a plain-text section) and never unfurled, so no link in it gets a preview beside the
    buttons."""
    return {
        "text": mrkdwn_escape(text),
        "mrkdwn": False,
        "unfurl_links": False,
        "unfurl_media": False,
        "blocks": blocks if blocks is not None else [{"type": "section", "text": verbatim(text)}],
    }


def approval_blocks(*, text: str, link: str, token: str) -> list[dict[str, Any]]:
    """A Block Kit message: the request (plain text), Approve/Reject buttons (carrying the signed token), the link."""
    return [
        {"type": "section", "text": verbatim(text)},
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "style": "primary",
                    "value": token,
                    "text": {"type": "plain_text", "text": "Approve"},
                },
                {
                    "type": "button",
                    "action_id": "reject",
                    "style": "danger",
                    "value": token,
                    "text": {"type": "plain_text", "text": "Reject"},
                },
                {"type": "button", "action_id": "open", "url": link, "text": {"type": "plain_text", "text": "Open"}},
            ],
        },
    ]


def _post(refund_id: str, body: dict[str, Any]) -> None:
    assert _config.slack_webhook_url is not None
    response = WebhookClient(_config.slack_webhook_url).send_dict(body)
    if response.status_code >= 400:
        raise RuntimeError(f"Slack webhook answered {response.status_code} for refund {refund_id}")


@DBOS.step(name="notify.slack_operators", retries_allowed=True, max_attempts=5, interval_seconds=2.0)
def slack_operators_step(refund_id: str, *, text: str) -> None:
    """Post an operator alert (a refund the provider failed) to Slack's incoming webhook, when one is configured."""
    _post(refund_id, slack_message(f"\u26a0 {text}"))
    log.info("operator alert for refund %s posted to Slack", refund_id)


@DBOS.step(name="notify.slack_approvers", retries_allowed=True, max_attempts=5, interval_seconds=2.0)
def slack_approvers_step(refund_id: str, *, text: str, link: str, token: str) -> None:
    """Post the approval request to Slack's incoming webhook (only when one is configured)."""
    _post(refund_id, slack_message(text, approval_blocks(text=text, link=link, token=token)))
    log.info("approval request for refund %s posted to Slack", refund_id)
