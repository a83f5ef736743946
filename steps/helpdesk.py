"""Outbox messages posted to the help-desk ticket a refund came from: the customer's as public replies, approvers' and
operators' as internal notes, each once.

Zendesk's ticket update (``PUT /api/v2/tickets/{id}.json`` with a comment) has no idempotency key, so each comment
ends with a marker derived from its outbox row's message key. The first attempt at a row posts at once; any later
attempt (the claim of a worker that died mid-post ran out, or an answer was lost) first lists the ticket's comments
and, when the marker is there, records the row sent without posting again.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from steps.faults import crash_point
from steps.mail import Claim, PermanentFailure
from steps.tls import client_context

log = logging.getLogger(__name__)

#: How many pages of a ticket's comments are read looking for a marker (Zendesk allows 5,000 comments a ticket).
MAX_PAGES = 60
_APPROVAL_LINK = re.compile(r"\S*/approve/[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\S*")
#: What replaces a signed approval link in an internal note: the link acts as its approver for whoever holds it, and
#: every agent of the help desk reads internal notes.
LINK_WITHHELD = "(approval link withheld from the ticket: decide in the console, in Slack or by the link sent to you)"


@dataclass(frozen=True)
class TicketsConfig:
    """The help desk's API (Zendesk-shaped): where, and the agent's email and API token it posts as."""

    base_url: str
    email: str
    token: str = field(repr=False)
    timeout_seconds: float = 10.0


class HelpdeskUnavailable(Exception):
    """The help desk did not answer, or answered 429 or 5xx: the attempt is retried after its backoff."""


def marker(message_key: str) -> str:
    """The stable mark a message's comment carries, whichever attempt posted it."""
    return f"[refund-agent:{hashlib.sha256(message_key.encode()).hexdigest()[:24]}]"


def comment_for(claim: Claim) -> tuple[str, bool]:
    """The comment's text and whether it is public: the customer's message is; anything else is an internal note."""
    public = claim.channel == "email"
    if public:
        text = claim.body
    elif claim.channel == "approvers":
        text = f"For approver {claim.recipient}:\n{_APPROVAL_LINK.sub(LINK_WITHHELD, claim.body)}"
    else:
        text = f"For operators:\n{_APPROVAL_LINK.sub(LINK_WITHHELD, claim.body)}"
    return f"{text}\n\n{marker(claim.message_key)}", public


def _call(config: TicketsConfig, method: str, url: str, body: Any = None) -> Any:
    auth = (f"{config.email}/token", config.token)
    try:
        with httpx.Client(timeout=config.timeout_seconds, follow_redirects=False, verify=client_context()) as http:
            response = http.request(method, url, auth=auth, json=body)
    except httpx.TransportError as error:  # the error names the host, never the token
        raise HelpdeskUnavailable(f"the help desk did not answer: {type(error).__name__}") from None
    status = response.status_code
    if status == 429 or status >= 500:
        raise HelpdeskUnavailable(f"the help desk answered HTTP {status}")
    if status >= 400:  # refused (401/403), no such ticket (404), too many comments (422): no retry helps
        raise PermanentFailure(f"the help desk refused the comment: HTTP {status}")
    return response.json()


def already_posted(config: TicketsConfig, ticket_id: str, mark: str) -> bool:
    """Whether a comment on the ticket carries ``mark`` (every page of its comments is read)."""
    url: str | None = f"{config.base_url.rstrip('/')}/api/v2/tickets/{ticket_id}/comments.json"
    for _ in range(MAX_PAGES):
        if url is None:
            return False
        page = _call(config, "GET", url) or {}
        for comment in page.get("comments") or []:
            if mark in str(comment.get("body") or "") or mark in str(comment.get("plain_body") or ""):
                return True
        nxt = page.get("next_page")
        url = nxt if isinstance(nxt, str) and nxt.startswith(config.base_url.rstrip("/")) else None
    raise HelpdeskUnavailable(f"ticket {ticket_id} has more than {MAX_PAGES} pages of comments")


def deliver(config: TicketsConfig, claim: Claim) -> None:
    """Post one claimed row to its ticket, unless an earlier attempt already did; raises what went wrong."""
    if claim.ticket_id is None:
        raise PermanentFailure(f"refund {claim.refund_id} came from no ticket")
    body, public = comment_for(claim)
    mark = marker(claim.message_key)
    if claim.attempt > 1 and already_posted(config, claim.ticket_id, mark):
        log.info("message %s is on ticket %s already (attempt %d): not posted again", claim.message_key,
                 claim.ticket_id, claim.attempt)  # fmt: skip
        return
    url = f"{config.base_url.rstrip('/')}/api/v2/tickets/{claim.ticket_id}.json"
    _call(config, "PUT", url, {"ticket": {"comment": {"body": body, "public": public}}})
    crash_point(
        "after_ticket_comment_posted"
    )  # the ticket has it; ``sent`` is not recorded: the window the marker covers
    log.info("message %s of refund %s posted to ticket %s (%s)", claim.message_key, claim.refund_id, claim.ticket_id,
             "public" if public else "internal note")  # fmt: skip
