"""Signed approval tokens: HMAC-SHA256 over the refund, the amount, the currency, an expiry and the approver.

A token is bound to the one who may use it: ``operator:<name>`` (the approver a link was sent to),
``client:<name>`` (an API client with ``approvals:decide``) or ``slack`` (Slack's buttons, where the clicking
user is checked against the allow-list). Whoever opens a link decides as the approver it names; nobody types
a name. Tokens without an approver (from before approvers were bound) do not verify.

A customer's answer link (``sign_answer``) carries a token of another purpose: signed with a key derived from the
same secret for answers only, over the refund, the question and the expiry, marked ``"k": "answer"``. An approval
token never verifies as an answer token, nor an answer token as an approval.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation


class TokenError(Exception):
    """``code`` is ``invalid`` (forged, malformed) or ``expired``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ApprovalClaims:
    refund_id: str
    amount: Decimal
    currency: str
    expires_at: datetime
    approver: str
    """``operator:<name>``, ``client:<name>`` or ``slack``."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(claims: ApprovalClaims, secret: bytes) -> str:
    body = json.dumps(
        {
            "r": claims.refund_id,
            "a": str(claims.amount),
            "c": claims.currency,
            "e": int(claims.expires_at.timestamp()),
            "p": claims.approver,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    mac = hmac.new(secret, body, hashlib.sha256).digest()
    return f"{_b64(body)}.{_b64(mac)}"


def verify(token: str, secret: bytes, *, now: datetime | None = None) -> ApprovalClaims:
    """The claims of a genuine, unexpired token; anything else raises TokenError."""
    try:
        body_part, mac_part = token.split(".")
        body, mac = _unb64(body_part), _unb64(mac_part)
    except (ValueError, TypeError) as error:
        raise TokenError("invalid", "malformed approval token") from error
    if not hmac.compare_digest(mac, hmac.new(secret, body, hashlib.sha256).digest()):
        raise TokenError("invalid", "approval token signature does not verify")
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "p" not in data:  # signed by a release before approvers were bound
            raise TokenError("invalid", "this approval link names no approver; decide in the console instead")
        claims = ApprovalClaims(
            refund_id=str(data["r"]),
            amount=Decimal(data["a"]),
            currency=str(data["c"]),
            expires_at=datetime.fromtimestamp(int(data["e"]), UTC),
            approver=str(data["p"]),
        )
    except (ValueError, KeyError, TypeError, InvalidOperation) as error:
        raise TokenError("invalid", "malformed approval token") from error
    if (now or datetime.now(UTC)) >= claims.expires_at:
        raise TokenError("expired", "this approval link has expired")
    return claims


@dataclass(frozen=True)
class AnswerClaims:
    """A customer's link to answer their refund's question: it answers that refund's question only, until then."""

    refund_id: str
    question: str
    expires_at: datetime


def _answer_key(secret: bytes) -> bytes:
    return hmac.new(secret, b"refund-agent customer answer link", hashlib.sha256).digest()


def sign_answer(claims: AnswerClaims, secret: bytes) -> str:
    body = json.dumps(
        {"k": "answer", "r": claims.refund_id, "q": claims.question, "e": int(claims.expires_at.timestamp())},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    mac = hmac.new(_answer_key(secret), body, hashlib.sha256).digest()
    return f"{_b64(body)}.{_b64(mac)}"


def verify_answer(token: str, secret: bytes, *, now: datetime | None = None) -> AnswerClaims:
    """The claims of a genuine, unexpired answer token; anything else (an approval token among them) raises."""
    try:
        body_part, mac_part = token.split(".")
        body, mac = _unb64(body_part), _unb64(mac_part)
    except (ValueError, TypeError) as error:
        raise TokenError("invalid", "malformed answer link") from error
    if not hmac.compare_digest(mac, hmac.new(_answer_key(secret), body, hashlib.sha256).digest()):
        raise TokenError("invalid", "this answer link's signature does not verify")
    try:
        data = json.loads(body)
        if data["k"] != "answer":
            raise ValueError("not an answer token")
        claims = AnswerClaims(
            refund_id=str(data["r"]), question=str(data["q"]), expires_at=datetime.fromtimestamp(int(data["e"]), UTC)
        )
    except (ValueError, KeyError, TypeError) as error:
        raise TokenError("invalid", "malformed answer link") from error
    if (now or datetime.now(UTC)) >= claims.expires_at:
        raise TokenError("expired", "this answer link has expired")
    return claims
