"""What the payment provider tells us about a refund (a verified webhook event, a scheduled re-read), and its outcome.

An event is a claim: it only says which refund to look at. Whatever it names is checked against our row
(steps/settlement.py ``judge``) and what is booked is read from the provider. Each event's outcome is
recorded once, in the application database, so /metrics counts them across the cluster:

- ``accepted``: it settled the refund (``succeeded``, ``failed``, ``canceled``) or reversed a paid one (``reversed``);
- ``ignored``: nothing to do (not a refund event, not final yet, the refund is still being paid or settled already,
  or the provider, re-read, says otherwise than the event);
- ``rejected``: it does not match our row (an unknown refund, another provider refund, key, charge or amount).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps.payments import charge_id_of
from steps.records import ProviderRefund, ProviderRefundStatus, Record, UnsupportedCurrencyError, from_minor
from steps.store import insert_if_absent, provider_events, session, transaction

log = logging.getLogger(__name__)

Outcome = Literal["accepted", "ignored", "rejected"]
Source = Literal["webhook", "recheck"]

#: A Stripe object id as we take it from an event (``evt_...``, ``re_...``, ``ch_...``); nothing else is kept or logged.
PROVIDER_ID = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_EVENT_TYPE = re.compile(r"^[a-z0-9_.]{1,64}$")
PROVIDER_STATUSES = frozenset(get_args(ProviderRefundStatus))


class ProviderEvent(Record):
    """One word from the provider about a refund: where it came from and what it named (ids only)."""

    key: str
    """Stripe's event id, or the re-read's workflow id: the event's row in ``provider_events``."""
    source: Source
    event_type: str = "recheck"
    provider_refund_id: str | None = None
    """The provider refund the event named (a re-read names none: it reads the one the row holds)."""
    status: str | None = None
    """The status the event claimed."""


def safe_id(value: Any) -> str | None:
    """``value`` when it is a well-formed provider id, else None (never logged nor stored as sent)."""
    return value if isinstance(value, str) and PROVIDER_ID.match(value) else None


def safe_event_type(value: Any) -> str:
    return value if isinstance(value, str) and _EVENT_TYPE.match(value) else "unknown"


def refund_from_event(body: Mapping[str, Any]) -> ProviderRefund | None:
    """The refund an event's body describes, or None when it is not a well-formed refund object."""
    provider_refund_id, amount, status = safe_id(body.get("id")), body.get("amount"), body.get("status")
    metadata, reason = body.get("metadata") or {}, body.get("failure_reason")
    if provider_refund_id is None or status not in PROVIDER_STATUSES or not isinstance(metadata, Mapping):
        return None
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        return None
    try:
        currency = str(body.get("currency")).upper()
        value = from_minor(amount, currency)
    except UnsupportedCurrencyError:
        return None
    key = metadata.get("idempotency_key")
    return ProviderRefund(
        provider_refund_id=provider_refund_id,
        amount=value,
        currency=currency,
        status=cast(ProviderRefundStatus, status),
        failure_reason=reason if isinstance(reason, str) else None,
        idempotency_key="",
        charge=charge_id_of(body.get("charge")),
        metadata_key=key if isinstance(key, str) else None,
    )


def record_event(
    conn: sa.Connection | Session, event: ProviderEvent, *, refund_id: str | None, outcome: Outcome, reason: str
) -> bool:
    """Record the event's outcome in the caller's transaction; the first outcome of an event stands
    (a redelivery or a retried step records nothing more). True when this call recorded it."""
    values = {
        "event_key": event.key,
        "source": event.source,
        "event_type": event.event_type,
        "refund_id": refund_id,
        "provider_refund_id": event.provider_refund_id,
        "outcome": outcome,
        "reason": reason,
        "received_at": datetime.now(UTC),
    }
    recorded = insert_if_absent(conn, provider_events, values)
    if recorded and outcome != "accepted":
        level = logging.WARNING if outcome == "rejected" else logging.INFO
        log.log(
            level,
            "provider %s %s for refund %s (provider refund %s): %s, %s",
            event.source,
            event.key,
            refund_id or "-",
            event.provider_refund_id or "-",
            outcome,
            reason,
        )
    return recorded


@transaction("provider_events.record")
def record_provider_event_step(event: ProviderEvent, *, refund_id: str | None, outcome: Outcome, reason: str) -> bool:
    """An event that changed nothing: its outcome, recorded once."""
    return record_event(session(), event, refund_id=refund_id, outcome=outcome, reason=reason)
