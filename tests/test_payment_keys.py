"""Provider idempotency keys over the whole accepted key space: at most 255 characters (Stripe's limit),
derived from the request only, today's form kept where it fits, and never shared by two requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from steps import payments

#: What POST /refunds accepts as an Idempotency-Key (agent/submit.py) and as an order id (agent/http/refunds.py).
#: Lengths drawn uniformly, so the long keys that need hashing are as common as the short ones.
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-"
REQUEST_KEYS = st.integers(8, 200).flatmap(lambda n: st.text(KEY_ALPHABET, min_size=n, max_size=n))
ORDER_CHARS = st.characters(codec="utf-8")
ORDER_IDS = st.integers(1, 64).flatmap(lambda n: st.text(ORDER_CHARS, min_size=n, max_size=n))
ATTEMPTS = st.integers(min_value=0, max_value=payments.MAX_ATTEMPT_KEYS - 1)


@settings(max_examples=500)
@given(refund_id=REQUEST_KEYS, order_id=ORDER_IDS, n=ATTEMPTS)
def test_every_accepted_request_gets_keys_stripe_accepts_derived_from_the_request_only(
    refund_id: str, order_id: str, n: int
) -> None:
    key = payments.attempt_key(refund_id, order_id, n)
    assert len(key) <= payments.MAX_PROVIDER_KEY_LENGTH
    assert key == payments.attempt_key(refund_id, order_id, n)  # a retry, a recovery, a fork: the same key
    legacy = f"refund:{refund_id}:{order_id}"
    base = payments.idempotency_key(refund_id, order_id)
    assert base == payments.attempt_key(refund_id, order_id, 0)
    if len(legacy) <= payments.MAX_PROVIDER_KEY_LENGTH:
        assert base == legacy  # refunds in flight before long keys were hashed keep their key
    else:
        assert base.startswith(legacy[:100])  # still readable in the provider's dashboard


@settings(max_examples=300)
@given(first=REQUEST_KEYS, second=REQUEST_KEYS, order_id=ORDER_IDS)
def test_two_requests_never_share_a_key(first: str, second: str, order_id: str) -> None:
    if first == second:
        return
    ours = {payments.attempt_key(first, order_id, n) for n in range(payments.MAX_ATTEMPT_KEYS)}
    theirs = {payments.attempt_key(second, order_id, n) for n in range(payments.MAX_ATTEMPT_KEYS)}
    assert len(ours) == payments.MAX_ATTEMPT_KEYS and not ours & theirs


def test_the_longest_request_is_hashed_to_exactly_the_limit_and_keeps_its_distinctions() -> None:
    a, b = "a" * 199 + "x", "a" * 199 + "y"  # differ only past the part that is kept verbatim
    order = "o" * 64
    assert len(payments.idempotency_key(a, order)) == 255
    assert payments.idempotency_key(a, order) != payments.idempotency_key(b, order)
    assert payments.attempt_key(a, order, 1) != payments.attempt_key(b, order, 1)
