"""Refunds at a Stripe-compatible provider, keyed so that no retry, recovery or fork can refund twice.

Unknown outcomes (a 5xx, a timeout, a dropped connection) are settled by asking the provider, not by
trusting a retry: a retried attempt first lists the charge's refunds and takes the one whose metadata
carries this refund's base key. Stripe saves a 5xx for a key once the endpoint started executing and
replays it for 24 hours, so a key that answered a *replayed* 5xx can never succeed; once a listing made
after that replay shows the provider holds nothing for the refund, the next attempt key is used
(``attempt_key(..., n + 1)``). Every create carries the base key in its metadata, so a refund made under
any attempt key is found by the same listing. A replayed create answers the refund as it was when first
made (``succeeded``, though the provider may have failed it since), so it is read again before it is
booked. README, "Payments", states the rule.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import stripe
from dbos import DBOS

from steps.faults import crash_point
from steps.records import ProviderRefund, ProviderRefundStatus, from_minor, minor_unit_problem, to_minor

log = logging.getLogger(__name__)

ISSUE_REFUND_STEP = "payments.issue_refund"
FETCH_REFUND_STEP = "payments.fetch_refund"
#: Reconcile a little before the provider forgets the key, not after.
KEY_TTL_MARGIN = timedelta(minutes=30)
#: Stripe refuses idempotency keys longer than this.
MAX_PROVIDER_KEY_LENGTH = 255
#: Attempt keys tried before giving up: each one is spent only by a saved 5xx proven to have made nothing.
MAX_ATTEMPT_KEYS = 16
#: A held refund in one of these is the refund (made, or on its way); failed and canceled ones are history.
_LIVE = ("succeeded", "pending", "requires_action")


@dataclass(frozen=True)
class PaymentsConfig:
    base_url: str
    api_key: str
    key_ttl_seconds: float


_config: PaymentsConfig | None = None


def configure(config: PaymentsConfig) -> None:
    global _config
    _config = config


@functools.lru_cache(maxsize=8)
def stripe_client(api_key: str, base_url: str) -> stripe.StripeClient:
    """One client per provider address and key, shared by every step thread: its HTTP client keeps a session (and
    its connections) per thread, and building a client builds HTTP clients with their own TLS contexts (tens of ms
    of CPU). No retries of its own: a step's retry settles an unknown outcome first."""
    return stripe.StripeClient(api_key, base_addresses={"api": base_url}, max_network_retries=0)


def _client() -> stripe.StripeClient:
    if _config is None:
        raise RuntimeError("payments are not configured; call runtime.start() first")
    return stripe_client(_config.api_key, _config.base_url)


class PaymentRefused(Exception):
    """The provider will not make this refund as asked; retrying cannot change that."""


class ChargeDisputed(PaymentRefused):
    """The provider refuses to refund a charge with an open dispute (Stripe's ``charge_disputed``): the dispute
    decides the money, so this refund is refused, not failed."""


def fit_key(text: str) -> str:
    """``text`` itself when Stripe accepts its length; else its head and the SHA-256 of all of it."""
    if len(text) <= MAX_PROVIDER_KEY_LENGTH:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{text[: MAX_PROVIDER_KEY_LENGTH - len(digest) - 1]}~{digest}"


def idempotency_key(refund_id: str, order_id: str) -> str:
    """The refund's base key, from the request only: a retry, a recovery or a fork sends the same key."""
    return fit_key(f"refund:{refund_id}:{order_id}")


def attempt_key(refund_id: str, order_id: str, n: int) -> str:
    """Key of the n-th create: the base key first; later ones only after the earlier key was proven spent."""
    return idempotency_key(refund_id, order_id) if n == 0 else fit_key(f"refund~{n}:{refund_id}:{order_id}")


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, stripe.IdempotencyError | PaymentRefused):
        return False  # same key, different parameters, or a refusal: never retried into a second refund
    if isinstance(error, stripe.APIConnectionError | stripe.RateLimitError):
        return True
    status = getattr(error, "http_status", None)
    return isinstance(error, stripe.StripeError) and (status is None or status >= 500 or status == 409)


def _replayed_server_error(error: stripe.StripeError) -> bool:
    headers = error.headers or {}
    replayed = str(headers.get("Idempotent-Replayed", headers.get("idempotent-replayed", ""))).lower() == "true"
    return replayed and (error.http_status or 0) >= 500


def describe_failure(error: BaseException) -> str:
    """One line for the refund's detail: the error's kind and, for Stripe errors, its code."""
    if isinstance(error, PaymentRefused):
        return f"{type(error).__name__}: {error}"
    code = getattr(error, "code", None)
    return f"{type(error).__name__}: {code}" if code else type(error).__name__


def charge_id_of(charge: Any) -> str | None:
    """A refund's ``charge``: its id, or the charge object itself when expanded."""
    found = charge if isinstance(charge, str) else getattr(charge, "id", None)
    return found if isinstance(found, str) else None


def _to_record(refund: stripe.Refund, key: str, *, reconciled: bool = False) -> ProviderRefund:
    currency = str(refund.currency).upper()
    headers = getattr(getattr(refund, "last_response", None), "headers", None) or {}
    metadata = cast(dict[str, str], refund.metadata.to_dict() if refund.metadata else {})
    return ProviderRefund(
        provider_refund_id=refund.id,
        amount=from_minor(int(refund.amount), currency),
        currency=currency,
        status=cast(ProviderRefundStatus, str(refund.status)),
        failure_reason=getattr(refund, "failure_reason", None) or None,
        idempotency_key=key,
        replayed=str(headers.get("Idempotent-Replayed", "")).lower() == "true",
        reconciled=reconciled,
        charge=charge_id_of(getattr(refund, "charge", None)),
        metadata_key=metadata.get("idempotency_key"),
    )


def charge_refunds(charge_id: str) -> Iterator[stripe.Refund]:
    """Every refund the provider holds on the charge, newest first, page by page."""
    return iter(_client().v1.refunds.list(params={"charge": charge_id, "limit": 100}).auto_paging_iter())


def find_refund(charge_id: str, key: str) -> stripe.Refund | None:
    """The charge's refund whose metadata carries ``key`` (Stripe lists by charge only; we match metadata).

    A live refund wins over failed or canceled ones made under the same key."""
    found: list[stripe.Refund] = []
    for refund in charge_refunds(charge_id):
        metadata = cast(dict[str, str], refund.metadata.to_dict() if refund.metadata else {})
        if metadata.get("idempotency_key") == key:
            found.append(refund)
    return next((r for r in found if r.status in _LIVE), found[0] if found else None)


def fetch_refund(provider_refund_id: str, key: str) -> ProviderRefund:
    """The provider's refund as it stands now (a pending refund is read again until it settles)."""
    return _to_record(_client().v1.refunds.retrieve(provider_refund_id), key)


def _held(charge_id: str, key: str, amount: Decimal, currency: str) -> ProviderRefund | None:
    """What the provider holds for this refund, checked against what we meant to pay."""
    refund = find_refund(charge_id, key)
    if refund is None:
        return None
    record = _to_record(refund, key, reconciled=True)
    if (record.amount, record.currency) != (amount, currency):
        raise PaymentRefused(f"the provider holds {refund.id} for {record.amount} {record.currency} under this key")
    return record


def _check_currency(charge_id: str, currency: str) -> None:
    """Stripe refunds a charge in the charge's currency: refuse before paying if that is not the order's."""
    charge = _client().v1.charges.retrieve(charge_id)
    if str(charge.currency).upper() != currency:
        raise PaymentRefused(f"charge {charge_id} is in {str(charge.currency).upper()}, the order in {currency}")


#: Both provider steps retry what may be transient, never a refusal or an idempotency conflict.
PROVIDER_RETRIES: dict[str, Any] = {
    "retries_allowed": True,
    "max_attempts": 6,
    "interval_seconds": 1.0,
    "backoff_rate": 2.0,
    "should_retry": _is_transient,
}


@DBOS.step(
    name=ISSUE_REFUND_STEP,
    **PROVIDER_RETRIES,
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
    """One refund at the provider; returns it with the provider's status (which may not be final yet)."""
    key = idempotency_key(refund_id, order_id)
    assert _config is not None
    step = DBOS.step_status
    retrying = step is not None and (step.current_attempt or 0) > 0  # the last attempt's outcome is unknown
    forgetting = datetime.now(UTC) - first_attempt_at >= timedelta(seconds=_config.key_ttl_seconds) - KEY_TTL_MARGIN
    if (retrying or forgetting) and (held := _held(charge_id, key, amount, currency)) is not None:
        log.info("refund %s reconciled with provider refund %s", refund_id, held.provider_refund_id)
        return held
    if (problem := minor_unit_problem(amount, currency)) is not None:  # policy refuses these first: never sent
        raise PaymentRefused(f"not sent to the provider: {problem}")
    _check_currency(charge_id, currency)
    crash_point("before_provider_call")
    for n in range(MAX_ATTEMPT_KEYS):
        sent = attempt_key(refund_id, order_id, n)
        try:
            refund = _client().v1.refunds.create(
                params={
                    "charge": charge_id,
                    "amount": to_minor(amount, currency),
                    "metadata": {"refund_id": refund_id, "order_id": order_id, "idempotency_key": key},
                },
                options={"idempotency_key": sent},
            )
        except stripe.IdempotencyError:
            # This key was used with other parameters (e.g. by an older release): trust only what is held.
            if (held := _held(charge_id, key, amount, currency)) is not None:
                return held
            raise
        except stripe.StripeError as error:
            if error.code == "charge_disputed":
                raise ChargeDisputed(f"charge {charge_id} has an open dispute at the provider") from None
            if not _replayed_server_error(error):
                raise
            # The key's saved 5xx is final, and its request is over: a listing now sees whatever it made.
            if (held := _held(charge_id, key, amount, currency)) is not None:
                return held
            log.warning(
                "refund %s: attempt key %d holds a saved %s, nothing was made; next key",
                refund_id,
                n,
                error.http_status,
            )
            continue
        crash_point("after_provider_call")
        record = _to_record(refund, sent)
        if record.replayed:  # the saved answer is the refund as it was first made: book it as it stands now
            record = _to_record(_client().v1.refunds.retrieve(refund.id), sent).model_copy(update={"replayed": True})
        settled = "paid" if record.status == "succeeded" else f"left {record.status}"
        log.info(
            "refund %s %s: provider refund %s (replayed=%s)",
            refund_id,
            settled,
            record.provider_refund_id,
            record.replayed,
        )
        return record
    raise PaymentRefused(f"the provider answered a saved error to all {MAX_ATTEMPT_KEYS} attempt keys")


@DBOS.step(
    name=FETCH_REFUND_STEP,
    **PROVIDER_RETRIES,
)
def fetch_refund_step(provider_refund_id: str, key: str) -> ProviderRefund:
    """Read a refund the provider has not settled yet (a scheduled re-read, or after its webhook)."""
    return fetch_refund(provider_refund_id, key)
