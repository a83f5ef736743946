"""Signed approval and answer tokens: what verifies, what expires, and what is refused as forged or malformed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from agent.tokens import AnswerClaims, ApprovalClaims, TokenError, sign, sign_answer, verify, verify_answer

SECRET = b"approval-signing-secret"
EXPIRES = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
CLAIMS = ApprovalClaims("req-2026-0001", Decimal("4200.00"), "USD", EXPIRES, "operator:dana")
BEFORE = EXPIRES - timedelta(seconds=1)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(body: bytes, secret: bytes = SECRET) -> str:
    return f"{_b64(body)}.{_b64(hmac.new(secret, body, hashlib.sha256).digest())}"


def _refused(token: str, code: str, message: str, secret: bytes = SECRET) -> None:
    with pytest.raises(TokenError, match=message) as raised:
        verify(token, secret, now=BEFORE)
    assert raised.value.code == code


def test_a_token_is_hmac_sha256_over_the_claims_as_canonical_json() -> None:
    """The format is part of every link already sent: it must not drift."""
    body = b'{"a":"4200.00","c":"USD","e":1796385600,"p":"operator:dana","r":"req-2026-0001"}'
    assert sign(CLAIMS, SECRET) == _signed(body)
    assert "=" not in sign(CLAIMS, SECRET)


def test_a_token_that_names_no_approver_does_not_verify() -> None:
    """Links signed before approvers were bound let whoever held them decide under any name: refused now."""
    unbound = _signed(b'{"a":"4200.00","c":"USD","e":1796385600,"r":"req-2026-0001"}')
    with pytest.raises(TokenError, match="names no approver") as raised:
        verify(unbound, SECRET, now=BEFORE)
    assert raised.value.code == "invalid"


@pytest.mark.parametrize("refund_id", ["r", "ab", "abc", "abcd", "req-2026-00001"])  # every base64 padding length
def test_a_genuine_token_verifies_to_its_claims(refund_id: str) -> None:
    claims = ApprovalClaims(refund_id, Decimal("0.01"), "JPY", EXPIRES, "operator:dana")
    assert verify(sign(claims, SECRET), SECRET, now=BEFORE) == claims


def test_the_claims_keep_the_amount_exactly_as_signed() -> None:
    found = verify(sign(CLAIMS, SECRET), SECRET, now=BEFORE)
    assert str(found.amount) == "4200.00" and found.currency == "USD" and found.refund_id == "req-2026-0001"
    assert found.expires_at == EXPIRES and found.expires_at.tzinfo is not None


def test_a_token_expires_at_its_expiry_not_after() -> None:
    token = sign(CLAIMS, SECRET)
    assert verify(token, SECRET, now=EXPIRES - timedelta(microseconds=1)) == CLAIMS
    for now in (EXPIRES, EXPIRES + timedelta(days=1)):
        with pytest.raises(TokenError, match="this approval link has expired") as raised:
            verify(token, SECRET, now=now)
        assert raised.value.code == "expired"


def test_without_a_given_time_a_token_is_judged_against_the_clock() -> None:
    now = datetime.now(UTC)
    live = ApprovalClaims(
        "req-live", Decimal("1.00"), "USD", (now + timedelta(hours=1)).replace(microsecond=0), "operator:dana"
    )
    assert verify(sign(live, SECRET), SECRET) == live
    dead = ApprovalClaims(
        "req-dead", Decimal("1.00"), "USD", (now - timedelta(hours=1)).replace(microsecond=0), "operator:dana"
    )
    with pytest.raises(TokenError) as raised:
        verify(sign(dead, SECRET), SECRET)
    assert raised.value.code == "expired"


def test_a_token_signed_with_another_secret_is_refused() -> None:
    _refused(sign(CLAIMS, b"someone else's key"), "invalid", "approval token signature does not verify")


def test_a_token_whose_claims_were_changed_is_refused() -> None:
    body, mac = sign(CLAIMS, SECRET).split(".")
    cheaper = _b64(json.dumps({"a": "4200.01", "c": "USD", "e": 1796385600, "r": "req-2026-0001"}).encode())
    _refused(f"{cheaper}.{mac}", "invalid", "signature does not verify")
    _refused(f"{body}.{_b64(b'x' * 32)}", "invalid", "signature does not verify")


@pytest.mark.parametrize(
    "token",
    ["", "no-dot", "a.b.c", "body.", "!!!!.????", "YQ.YQ.YQ"],
    ids=["empty", "one part", "three parts", "empty mac", "not base64", "three base64 parts"],
)
def test_a_token_that_is_not_two_base64_parts_is_malformed(token: str) -> None:
    with pytest.raises(TokenError) as raised:
        verify(token, SECRET, now=BEFORE)
    assert raised.value.code == "invalid"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'["a", "list"]',
        b'{"a":"4200.00","c":"USD","e":1796385600,"p":"operator:dana"}',
        b'{"a":"lots","c":"USD","e":1796385600,"p":"operator:dana","r":"x"}',
        b'{"a":"1.00","c":"USD","e":"soon","p":"operator:dana","r":"x"}',
        b'{"a":"1.00","c":"USD","e":null,"p":"operator:dana","r":"x"}',
    ],
    ids=["not json", "not an object", "no refund", "amount not a number", "expiry not a number", "no expiry"],
)
def test_a_genuinely_signed_token_with_malformed_claims_is_refused(body: bytes) -> None:
    _refused(_signed(body), "invalid", "malformed approval token")


def test_verified_claims_cannot_be_altered() -> None:
    claims = verify(sign(CLAIMS, SECRET), SECRET, now=BEFORE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        claims.amount = Decimal("1000000.00")  # type: ignore[misc]


def test_an_answer_token_is_signed_with_a_key_of_its_own_and_never_passes_for_an_approval() -> None:
    """A customer's answer link: HMAC over its own claims under a key derived from the secret for answers only, so
    what the approval secret signs never answers, and neither token verifies as the other."""
    answer = AnswerClaims("req-2026-0001", "delivery", EXPIRES)
    token = sign_answer(answer, SECRET)
    body = b'{"e":1796385600,"k":"answer","q":"delivery","r":"req-2026-0001"}'
    key = hmac.new(SECRET, b"refund-agent customer answer link", hashlib.sha256).digest()
    assert token == _signed(body, key) != _signed(body)
    assert verify_answer(token, SECRET, now=BEFORE) == answer
    with pytest.raises(TokenError, match="does not verify"):
        verify_answer(_signed(body), SECRET, now=BEFORE)  # the same claims under the approval secret
    with pytest.raises(TokenError):
        verify_answer(sign(CLAIMS, SECRET), SECRET, now=BEFORE)
    other = body.replace(b'"k":"answer"', b'"k":"approval"')  # under the answer key, but not marked an answer
    with pytest.raises(TokenError, match="malformed"):
        verify_answer(_signed(other, key), SECRET, now=BEFORE)
    with pytest.raises(TokenError):
        verify(token, SECRET, now=BEFORE)
    with pytest.raises(TokenError, match="expired"):
        verify_answer(token, SECRET, now=EXPIRES)
