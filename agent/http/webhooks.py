"""Stripe's webhook: a refund the provider settled later, or failed after paying it.

The signature proves Stripe sent the event, not that the event is about what it says: the refund it names
is judged against our row (``steps.settlement.judge``: the row's provider refund id, metadata base key,
amount, currency and charge) before anything is enqueued, and the settlement then re-reads the provider
refund the row holds. Every verified event's outcome is recorded once (``provider_events``) and counted in
/metrics; one that changes nothing is logged with ids only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any

import stripe
from fastapi import APIRouter, Request

from agent.http.openapi import errors
from agent.http.problems import Problem
from agent.services import ServicesDep
from agent.settlement import event_options
from agent.submit import KEY_PATTERN
from steps.provider_events import (
    PROVIDER_STATUSES,
    Outcome,
    ProviderEvent,
    record_event,
    refund_from_event,
    safe_event_type,
    safe_id,
)
from steps.settlement import judge, provider_view
from steps.store import app_db

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhooks"])

#: The events that tell us a refund changed (Stripe sends refund.failed, and refund.updated for the rest).
REFUND_EVENTS = frozenset({"refund.updated", "refund.failed"})
_REFUND_ID = re.compile(KEY_PATTERN)


def _screen(event: ProviderEvent, body: Mapping[str, Any]) -> tuple[str | None, Outcome, str]:
    """Judge the event against our row: (our refund's id when we hold it, outcome, reason); ``accepted`` means
    the refund it names is the one the row holds and its word may settle the row (or reverse a paid one)."""
    if event.event_type not in REFUND_EVENTS:
        return None, "ignored", "not_a_refund_event"
    payment = refund_from_event(body)
    metadata = body.get("metadata")
    named = metadata.get("refund_id") if isinstance(metadata, Mapping) else None
    if payment is None or safe_id(event.key) is None:
        return None, "rejected", "malformed_event"
    if not (isinstance(named, str) and _REFUND_ID.match(named)):
        return None, "rejected", "unknown_refund"
    with app_db().engine.connect() as conn:
        row = provider_view(conn, named)
    outcome, reason = judge(row, payment, reversible=True)
    return (named if row is not None else None), outcome, reason


def _record(event: ProviderEvent, refund_id: str | None, outcome: Outcome, reason: str) -> None:
    with app_db().engine.begin() as conn:
        record_event(conn, event, refund_id=refund_id, outcome=outcome, reason=reason)


@router.post(
    "/webhooks/stripe",
    status_code=200,
    responses=errors(401, 503, e401="no webhook secret configured, or the Stripe signature is missing, stale or wrong"),
)
async def stripe_webhook(request: Request, svc: ServicesDep) -> dict[str, Any]:
    """Verify Stripe's signature (``Stripe-Signature``, 5-minute tolerance), check the refund the event names
    against our row, and enqueue its settlement; anything else changes nothing and says why.

    The event only says *which* refund to look at: the settlement reads the refund the row holds from the
    provider. A redelivered event enqueues the same workflow id and is dropped."""
    secret = svc.settings.webhook_secret()
    if secret is None:  # nothing can be verified, so nothing is accepted
        raise Problem(401, "no Stripe webhook secret is configured (STRIPE_WEBHOOK_SECRET)")
    payload = await request.body()
    try:
        verified = stripe.Webhook.construct_event(payload, request.headers.get("Stripe-Signature", ""), secret)
    except (ValueError, stripe.SignatureVerificationError) as error:
        raise Problem(401, "the Stripe signature is missing, stale or wrong") from error
    whole = verified.to_dict()
    data = whole.get("data")
    found = data.get("object") if isinstance(data, dict) else None
    body: dict[str, Any] = found if isinstance(found, dict) else {}
    status = body.get("status")
    event = ProviderEvent(
        key=safe_id(whole.get("id")) or f"sha256-{hashlib.sha256(payload).hexdigest()}",
        source="webhook",
        event_type=safe_event_type(whole.get("type")),
        provider_refund_id=safe_id(body.get("id")),
        status=status if status in PROVIDER_STATUSES else None,
    )
    refund_id, outcome, reason = await asyncio.to_thread(_screen, event, body)
    if outcome != "accepted" or refund_id is None or event.provider_refund_id is None:
        await asyncio.to_thread(_record, event, refund_id, outcome, reason)
        return {"received": True, "handled": False, "outcome": outcome, "reason": reason}
    facts = {"id": event.key, "type": event.event_type, "status": event.status or ""}
    options = event_options(refund_id, event.key)
    await asyncio.to_thread(svc.client.enqueue, options, refund_id, event.provider_refund_id, facts)
    log.info("refund %s: provider refund %s %s (webhook %s)", refund_id, event.provider_refund_id, reason, event.key)
    return {"received": True, "handled": True, "outcome": outcome, "reason": reason}
