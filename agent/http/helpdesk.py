"""The help desk's webhook (Zendesk): a new ticket starts a refund, a customer's comment on its ticket is kept, and
answers the refund's question when it asks one (agent/http/answers.py ``take_answer``).

Who asks is the channel's: whoever signs with ``HELPDESK_WEBHOOK_SECRET`` is the help desk's principal
(``HELPDESK_PRINCIPAL``), never anyone the body names. A ticket starts one refund at most: its id is
``zendesk-ticket-<ticket id>``, submitted through the same path and rules as ``POST /refunds``. A replayed delivery
(the same signature again) is answered 200 and changes nothing, so Zendesk, which retries some failed deliveries,
never loops on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError

from agent.domain import RefundRequest
from agent.http import zendesk
from agent.http.answers import take_answer
from agent.http.openapi import errors
from agent.http.problems import Problem, describe
from agent.services import Services, ServicesDep
from agent.submit import SubmissionError, submit_refund
from steps import helpdesk_inbox
from steps.evidence import AnswerFile, CustomerAnswer
from steps.questions import question_of
from steps.refunds import Requester
from steps.store import app_db

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhooks"])


def _start_refund(svc: Services, event: zendesk.TicketEvent) -> dict[str, Any]:
    engine = app_db().engine
    refund_id = event.refund_id
    if helpdesk_inbox.ticket_refund(engine, event.ticket_id) is not None:  # a ticket never starts a second refund
        return {"outcome": "refund_exists", "refund_id": refund_id}
    if event.order_id is None:
        raise Problem(422, "the ticket names no order: set its external id (or a tag order_<order id>)")
    try:
        request = RefundRequest(order_id=event.order_id, message=event.description)
    except ValidationError as error:
        raise Problem(422, "; ".join(describe(e) for e in error.errors())) from error
    requester = Requester(principal=f"client:{svc.settings.helpdesk.principal}")
    helpdesk_inbox.link_ticket(engine, ticket_id=event.ticket_id, refund_id=refund_id, requested_by=requester.principal)
    try:
        sub = submit_refund(svc.client, idempotency_key=refund_id, request=request, requester=requester)
    except SubmissionError as error:
        raise Problem(error.status, str(error)) from error
    log.info("ticket %s: refund %s %s", event.ticket_id, refund_id, "started" if sub.created else "already started")
    return {"outcome": "refund_started" if sub.created else "refund_exists", "refund_id": refund_id}


def _keep_comment(event: zendesk.TicketEvent) -> dict[str, Any]:
    engine = app_db().engine
    refund_id = helpdesk_inbox.ticket_refund(engine, event.ticket_id)
    if refund_id is None:
        return {"outcome": "ignored", "reason": "no refund was started from this ticket"}
    if event.by_staff or not event.comment_public:
        return {"outcome": "ignored", "reason": "not a public comment by the customer", "refund_id": refund_id}
    assert event.comment_id is not None  # read_event requires it on a comment
    comment = helpdesk_inbox.TicketComment(
        comment_id=event.comment_id,
        ticket_id=event.ticket_id,
        author_role="end-user",
        body=event.comment_body,
        created_at=event.comment_at or datetime.now(UTC),
    )
    new = helpdesk_inbox.record_comment(engine, comment, refund_id=refund_id)
    kept = {"outcome": "comment_recorded" if new else "comment_already_recorded", "refund_id": refund_id}
    with engine.connect() as conn:
        asked = question_of(conn, refund_id)
    if asked is None:
        return kept
    answer = CustomerAnswer(
        question=asked.question,
        text=event.comment_body,
        tracking_number=tracking_number_in(event.comment_body) if asked.question == "return_tracking" else "",
        files=[
            AnswerFile(name=a.file_name, content_type=a.content_type, size=a.size, url=a.url) for a in event.attachments
        ],
        via=f"helpdesk:{event.comment_id}",
    )
    status, said, _ = take_answer(refund_id, answer, key=f"helpdesk:{event.comment_id}")
    outcome = {202: "answer_recorded", 409: "answer_refused", 410: "answer_too_late"}[status]
    return {**kept, "outcome": outcome, "answer_status": status, "reason": said}


_TRACKING = re.compile(r"\b(?=[A-Z0-9-]*[0-9])(?=[A-Z0-9-]*[A-Z])[A-Z0-9][A-Z0-9-]{6,38}[A-Z0-9]\b|\b[0-9]{10,30}\b")


def tracking_number_in(text: str) -> str:
    """A tracking number in the customer's words (letters and digits, 8-40 long, or 10-30 digits); empty if none."""
    found = _TRACKING.search(text.upper())
    return found.group(0) if found else ""


def _handle(svc: Services, signature: str, event: zendesk.TicketEvent) -> dict[str, Any]:
    if helpdesk_inbox.delivered_before(app_db().engine, signature):
        return {"outcome": "replayed", "reason": "this signed delivery was handled before; nothing was done again"}
    answer = _start_refund(svc, event) if event.event_type == zendesk.TICKET_CREATED else _keep_comment(event)
    outcome = answer["outcome"]
    engine = app_db().engine
    helpdesk_inbox.record_delivery(
        engine, signature=signature, event_type=event.event_type, ticket_id=event.ticket_id, outcome=outcome
    )
    return answer


@router.post(
    "/webhooks/helpdesk",
    status_code=200,
    responses=errors(
        401,
        404,
        409,
        422,
        503,
        e401="no help desk configured, or the Zendesk signature is missing or wrong, or its timestamp is stale (more "
        "than `HELPDESK_WEBHOOK_TOLERANCE_SECONDS` from now)",
        e404="the ticket's order does not exist",
        e409="the ticket's refund id was already used by another client",
        e422="a body that is not a Zendesk ticket event, or a ticket naming no order or with no description",
    ),
)
async def helpdesk_webhook(request: Request, svc: ServicesDep) -> dict[str, Any]:
    """Zendesk's ticket events, signed: ``ticket.created`` starts the ticket's refund (once), and
    ``ticket.comment_added`` by the customer on such a ticket is kept (once per comment id); anything else is
    acknowledged and ignored. The answer's ``outcome`` says which."""
    desk = svc.settings.helpdesk
    if desk.webhook_secret is None:
        raise Problem(401, "no help desk webhook secret is configured here (HELPDESK_WEBHOOK_SECRET)")
    body = await request.body()
    signature = request.headers.get(zendesk.SIGNATURE_HEADER, "")
    zendesk.verify(
        desk.webhook_secret.get_secret_value(),
        request.headers.get(zendesk.TIMESTAMP_HEADER, ""),
        signature,
        body,
        tolerance_seconds=desk.tolerance_seconds,
        now=datetime.now(UTC),
    )
    try:
        payload = json.loads(body)
    except ValueError as error:
        raise Problem(422, "the body is not valid JSON") from error
    event = zendesk.read_event(payload)
    if event is None:
        return {"received": True, "handled": False, "outcome": "ignored", "reason": "not a ticket event acted on"}
    answer = await asyncio.to_thread(_handle, svc, signature.strip(), event)
    return {"received": True, "handled": answer["outcome"] not in ("ignored", "replayed"), **answer}
