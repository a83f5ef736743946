"""Refunds at a Stripe-compatible provider, keyed so that a retried step cannot refund twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import cast

import stripe
from dbos import DBOS

from steps.faults import crash_point
from steps.records import ProviderRefund, from_minor, to_minor

log = logging.getLogger(__name__)

ISSUE_REFUND_STEP = "payments.issue_refund"
#: Reconcile a little before the provider forgets the key, not after.
KEY_TTL_MARGIN = timedelta(minutes=30)


@dataclass(frozen=True)
class PaymentsConfig:
    base_url: str
    api_key: str
    key_ttl_seconds: float


_config: PaymentsConfig | None = None


def configure(config: PaymentsConfig) -> None:
    global _config
    _config = config


def _client() -> stripe.StripeClient:
    if _config is None:
        raise RuntimeError("payments are not configured; call runtime.start() first")
    return stripe.StripeClient(_config.api_key, base_addresses={"api": _config.base_url}, max_network_retries=0)


def idempotency_key(refund_id: str, order_id: str) -> str:
    """Derived from the request key only: a retry, a recovery or a fork sends the same key."""
    return f"refund:{refund_id}:{order_id}"


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, stripe.IdempotencyError):
        return False  # same key, different parameters: a bug, never retried into a second refund
    if isinstance(error, stripe.APIConnectionError | stripe.RateLimitError):
        return True
    status = getattr(error, "http_status", None)
    return isinstance(error, stripe.StripeError) and (status is None or status >= 500 or status == 409)


def _to_record(refund: stripe.Refund, key: str, *, reconciled: bool = False) -> ProviderRefund:
    currency = str(refund.currency).upper()
    headers = getattr(getattr(refund, "last_response", None), "headers", None) or {}
    return ProviderRefund(
        provider_refund_id=refund.id,
        amount=from_minor(int(refund.amount), currency),
        currency=currency,
        status=str(refund.status),
        idempotency_key=key,
        replayed=str(headers.get("Idempotent-Replayed", "")).lower() == "true",
        reconciled=reconciled,
    )


def find_refund(charge_id: str, key: str) -> stripe.Refund | None:
    """Look the refund up by its metadata, for when the provider may have forgotten the key."""
    for refund in _client().v1.refunds.list(params={"charge": charge_id, "limit": 100}).auto_paging_iter():
        metadata = cast(dict[str, str], refund.metadata.to_dict() if refund.metadata else {})
        if metadata.get("idempotency_key") == key:
            return refund
    return None


@DBOS.step(
    name=ISSUE_REFUND_STEP,
    retries_allowed=True,
    max_attempts=6,
    interval_seconds=1.0,
    backoff_rate=2.0,
    should_retry=_is_transient,
)
def issue_refund_step(
    *,
    refund_id: str,
    order_id: str,
    charge_id: str,
    amount: Decimal,
    currency: str,
    first_attempt_at: datetime,
) -> ProviderRefund:
    """One refund at the provider. Safe to run again: the key makes the provider replay the first result."""
    key = idempotency_key(refund_id, order_id)
    assert _config is not None
    if datetime.now(UTC) - first_attempt_at >= timedelta(seconds=_config.key_ttl_seconds) - KEY_TTL_MARGIN:
        existing = find_refund(charge_id, key)
        if existing is not None:
            log.info("refund %s reconciled with provider refund %s", refund_id, existing.id)
            return _to_record(existing, key, reconciled=True)
    crash_point("before_provider_call")
    refund = _client().v1.refunds.create(
        params={
            "charge": charge_id,
            "amount": to_minor(amount, currency),
            "currency": currency.lower(),
            "metadata": {"refund_id": refund_id, "order_id": order_id, "idempotency_key": key},
        },
        options={"idempotency_key": key},
    )
    crash_point("after_provider_call")
    record = _to_record(refund, key)
    log.info(
        "refund %s paid: provider refund %s (replayed=%s)",
        refund_id,
        record.provider_refund_id,
        record.replayed,
    )
    return record
