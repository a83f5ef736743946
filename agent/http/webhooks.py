"""Stripe's webhook: a refund the provider settled later. The signature is the only proof it carries."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa
import stripe
from fastapi import APIRouter, Request

from agent.http.problems import Problem
from agent.services import ServicesDep
from agent.settlement import FINAL, event_options
from steps.settlement import UNSETTLED
from steps.store import app_db, refunds

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhooks"])

#: The events that tell us a refund changed (Stripe sends refund.failed, and refund.updated for the rest).
REFUND_EVENTS = frozenset({"refund.updated", "refund.failed"})


def _waiting(refund_id: str, provider_refund_id: str) -> bool:
    """Whether our refund ``refund_id`` waits on this provider refund (or is still being paid)."""
    with app_db().engine.connect() as conn:
        row = conn.execute(
            sa.select(refunds.c.status, refunds.c.provider_refund_id).where(refunds.c.refund_id == refund_id)
        ).one_or_none()
    return row is not None and row.status in UNSETTLED and row.provider_refund_id in (None, provider_refund_id)


@router.post("/webhooks/stripe", status_code=200)
async def stripe_webhook(request: Request, svc: ServicesDep) -> dict[str, Any]:
    """Verify Stripe's signature (``Stripe-Signature``, 5-minute tolerance) and settle the refund it names.

    The event only says *which* refund to look at: the settlement reads the refund from the provider.
    A repeated or replayed event enqueues the same workflow id and is dropped."""
    secret = svc.settings.webhook_secret()
    if secret is None:  # nothing can be verified, so nothing is accepted
        raise Problem(401, "no Stripe webhook secret is configured (STRIPE_WEBHOOK_SECRET)")
    payload = await request.body()
    try:
        event = stripe.Webhook.construct_event(payload, request.headers.get("Stripe-Signature", ""), secret)
    except (ValueError, stripe.SignatureVerificationError) as error:
        raise Problem(401, "the Stripe signature is missing, stale or wrong") from error
    if event.type not in REFUND_EVENTS:
        return {"received": True, "handled": False}
    refund: dict[str, Any] = event.data.object.to_dict()
    metadata = refund.get("metadata") or {}
    refund_id, provider_refund_id, status = metadata.get("refund_id"), str(refund.get("id")), str(refund.get("status"))
    if not isinstance(refund_id, str) or status not in FINAL:
        return {"received": True, "handled": False}
    if not await asyncio.to_thread(_waiting, refund_id, provider_refund_id):
        return {"received": True, "handled": False}
    await asyncio.to_thread(svc.client.enqueue, event_options(refund_id, status), refund_id, provider_refund_id)
    log.info("refund %s: provider refund %s %s (webhook %s)", refund_id, provider_refund_id, status, event.id)
    return {"received": True, "handled": True}
