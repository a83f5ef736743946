"""Zendesk's webhook as it arrives: its signature (checked exactly as Zendesk signs) and its ticket events, read.

Zendesk signs each delivery with the webhook's signing secret: ``X-Zendesk-Webhook-Signature`` is
base64(HMAC-SHA256(secret, timestamp + body)), the timestamp being ``X-Zendesk-Webhook-Signature-Timestamp`` as sent
(ISO 8601, e.g. ``2026-12-06T08:00:00Z``). The events read are Zendesk's event-subscribed ticket events
(``zen:event-type:ticket.created``, ``zen:event-type:ticket.comment_added``, schema version 2022-11-06).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.http.problems import Problem

SIGNATURE_HEADER = "X-Zendesk-Webhook-Signature"
TIMESTAMP_HEADER = "X-Zendesk-Webhook-Signature-Timestamp"
TICKET_CREATED = "zen:event-type:ticket.created"
COMMENT_ADDED = "zen:event-type:ticket.comment_added"
#: The refund a ticket starts: its id (and so its workflow id and idempotency key) derives from the ticket's.
REFUND_KEY_PREFIX = "zendesk-ticket-"
#: A tag that names the order when the ticket's external id does not: ``order_<order id>``.
ORDER_TAG_PREFIX = "order_"
_ID = re.compile(r"^[0-9]{1,20}$")
_ORDER = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """What Zendesk sends as the signature of ``body`` at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + body, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def verify(secret: str, timestamp: str, signature: str, body: bytes, *, tolerance_seconds: int, now: datetime) -> None:
    """Raise a 401 problem unless ``signature`` is the secret's over timestamp + body and the timestamp is fresh.

    The signature is compared first, in constant time, so nobody without the secret learns anything from the answer
    about the timestamp rule."""
    if not timestamp or not signature:
        raise Problem(401, f"the {SIGNATURE_HEADER} and {TIMESTAMP_HEADER} headers are required")
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), signature.strip().encode()):
        raise Problem(401, "the help desk signature is wrong: not signed with this service's help desk secret")
    try:
        stamp = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise Problem(401, f"{TIMESTAMP_HEADER} is not an ISO 8601 time") from None
    stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    skew = abs((now - stamp).total_seconds())
    if skew > tolerance_seconds:
        raise Problem(
            401,
            f"stale delivery: signed at {timestamp}, {skew:.0f} s from now (at most {tolerance_seconds} s); "
            "a replayed or delayed request is refused",
        )


@dataclass(frozen=True)
class Attachment:
    """A file on a comment, as Zendesk lists it: its name, type, size and where Zendesk keeps it."""

    file_name: str
    content_type: str
    size: int
    url: str


def attachments_of(comment: dict[str, Any]) -> tuple[Attachment, ...]:
    """The comment's attachments (Zendesk's ``attachments``: ``file_name``, ``content_type``, ``size``,
    ``content_url``); malformed entries are skipped."""
    found = comment.get("attachments")
    kept: list[Attachment] = []
    for item in found if isinstance(found, list) else []:
        if not isinstance(item, dict):
            continue
        size, kind, url = item.get("size"), item.get("content_type"), item.get("content_url")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(kind, str):
            continue
        name = item.get("file_name")
        kept.append(
            Attachment(
                str(name)[:200] if isinstance(name, str) else "", kind[:100], size, url if isinstance(url, str) else ""
            )
        )
    return tuple(kept[:20])


@dataclass(frozen=True)
class TicketEvent:
    """One ticket event: which ticket, and what it carries (a new ticket's order and words, or a comment)."""

    event_type: str
    ticket_id: str
    order_id: str | None = None
    description: str = ""
    comment_id: str | None = None
    comment_body: str = ""
    comment_public: bool = False
    by_staff: bool = True
    comment_at: datetime | None = None
    attachments: tuple[Attachment, ...] = ()
    """The comment's attachments as Zendesk describes them (never fetched: referenced by URL)."""

    @property
    def refund_id(self) -> str:
        return f"{REFUND_KEY_PREFIX}{self.ticket_id}"


def _id(value: Any, what: str) -> str:
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    if not _ID.match(text):
        raise Problem(422, f"{what} is not a Zendesk id (digits)")
    return text


def order_of(detail: dict[str, Any]) -> str | None:
    """The order a ticket is about: its external id, else a tag ``order_<order id>``."""
    external = detail.get("external_id")
    if isinstance(external, str) and _ORDER.match(external.strip()):
        return external.strip()
    tags = detail.get("tags")
    for tag in tags if isinstance(tags, list) else []:
        if isinstance(tag, str) and tag.startswith(ORDER_TAG_PREFIX) and _ORDER.match(tag[len(ORDER_TAG_PREFIX) :]):
            return tag[len(ORDER_TAG_PREFIX) :]
    return None


def _time(value: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def read_event(payload: Any) -> TicketEvent | None:
    """The ticket event in a verified body; None for an event type this service does not act on; a 422 problem
    for a body that is not a ticket event of Zendesk's shape."""
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        raise Problem(422, "the body is not a Zendesk event: a JSON object with a `type`")
    kind = payload["type"]
    if kind not in (TICKET_CREATED, COMMENT_ADDED):
        return None
    detail = payload.get("detail")
    if not isinstance(detail, dict):
        raise Problem(422, "the event has no `detail` object (the ticket)")
    ticket_id = _id(detail.get("id"), "detail.id")
    if kind == TICKET_CREATED:
        description = detail.get("description")
        return TicketEvent(
            kind, ticket_id, order_id=order_of(detail), description=description if isinstance(description, str) else ""
        )
    comment = (payload.get("event") or {}).get("comment") if isinstance(payload.get("event"), dict) else None
    if not isinstance(comment, dict):
        raise Problem(422, "the comment_added event has no `event.comment` object")
    found = comment.get("author")
    author: dict[str, Any] = found if isinstance(found, dict) else {}
    body = comment.get("body")
    return TicketEvent(
        kind,
        ticket_id,
        comment_id=_id(comment.get("id"), "event.comment.id"),
        comment_body=body if isinstance(body, str) else "",
        comment_public=comment.get("is_public") is True,
        by_staff=author.get("is_staff") is not False,  # only an author Zendesk says is not staff is the customer
        comment_at=_time(payload.get("time")),
        attachments=attachments_of(comment),
    )
