"""Console sign-in: scrypt password hashes, sessions and their lifetime, CSRF tokens, roles, and the
sign-in throttle's numbers.

A signed-in session is a row (``steps.console_sessions``): the cookie carries a random id. Before sign-in
the sign-in form's CSRF token rides in a cookie signed with the session secret; it grants nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import cache, cached_property
from typing import Any

from agent.identity import ROLES, Operator, Role, parse_operators, role_at_least
from steps.sign_in_throttle import AddressLimit, Backoff

__all__ = ["ROLES", "Operator", "Role", "parse_operators"]

SESSION_COOKIE = "refund_console_session"
"""The signed-in session's random id (the database keeps its hash)."""
FORM_COOKIE = "refund_console_form"
"""The sign-in form's CSRF token, signed, for visitors not signed in."""

SESSION_IDLE = timedelta(minutes=30)
"""A session not used for this long ends (a refund page being worked on reloads itself, and so keeps it)."""
SESSION_LIFETIME = timedelta(hours=12)
"""A session ends this long after sign-in however busy it is: a working day, then sign in again."""
SESSION_TOUCH_EVERY = timedelta(minutes=1)
"""A session's last use is written at most this often (a refund page reloads every 2 s)."""
FORM_SECONDS = 2 * 3600

BACKOFF = Backoff(
    free_failures=5,
    first_delay=timedelta(seconds=5),
    longest_delay=timedelta(minutes=5),
    forget_after=timedelta(days=1),
)
"""Per name: five failures cost nothing, then 5 s, 10 s, 20 s, ... up to 5 min between attempts."""
ADDRESS_LIMIT = AddressLimit(failures=20, window=timedelta(minutes=5))
"""Per client address: 20 failures in a 5-minute window, whatever names they tried."""

# scrypt cost: 16 MiB and ~50 ms per check here; slow enough to make a stolen hash expensive to guess.
_N, _R, _P = 2**14, 8, 1


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64), what ``refund-agent hash-password`` prints."""
    if not password:
        raise ValueError("the password must not be empty")
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, hashed: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = hashed.split("$")
        if scheme != "scrypt":
            return False
        computed = hashlib.scrypt(
            password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p), dklen=len(_unb64(digest))
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(computed, _unb64(digest))


def generated_admin(password: str) -> Operator:
    """The default ``admin`` made when no operator is configured. Its salt derives from its password, so
    the hash, and with it the sessions' credentials fingerprint, stays the same across restarts."""
    salt = hashlib.sha256(b"console-admin:" + password.encode()).digest()[:16]
    return Operator("admin", "admin", hash_password(password, salt=salt))


class GeneratedAdmin(Mapping[str, Operator]):
    """The operators when none is configured: ``admin`` alone, its hash made when first needed (a sign-in or a
    session's check), not at every start: a scrypt hash costs 50 ms of CPU, and most starts never serve the console."""

    def __init__(self, password: str) -> None:
        self._password = password

    @cached_property
    def _admin(self) -> Operator:
        return generated_admin(self._password)

    def __getitem__(self, name: str) -> Operator:
        if name != "admin":
            raise KeyError(name)
        return self._admin

    def __contains__(self, name: object) -> bool:
        return name == "admin"

    def __iter__(self) -> Iterator[str]:
        return iter(("admin",))

    def __len__(self) -> int:
        return 1


@cache
def _dummy_hash() -> str:
    """Checked when the name is unknown, so a wrong name costs the same time as a wrong password."""
    return hash_password("not a real password", salt=b"\x00" * 16)


def authenticate(operators: Mapping[str, Operator], name: str, password: str) -> Operator | None:
    operator = operators.get(name)
    ok = check_password(password, operator.password_hash if operator else _dummy_hash())
    return operator if ok and operator else None


def credentials(operator: Operator) -> str:
    """A fingerprint of what signed the operator in (role and password hash): when either changes in the
    configuration, sessions started before no longer match it and end."""
    return hashlib.sha256(f"{operator.role}:{operator.password_hash}".encode()).hexdigest()


def name_digest(secret: bytes, name: str) -> str:
    """What the sign-in throttle keeps of a typed name: the name field may hold a mistyped password."""
    return hmac.new(secret, b"console-sign-in-name:" + name.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Session:
    csrf: str
    expires: int
    operator: str | None = None
    role: Role | None = None
    ref: str | None = None
    """The signed-in session's row (its id's hash); None before sign-in."""

    def may(self, role: Role) -> bool:
        """Admins may do everything approvers may; approvers everything viewers may."""
        return role_at_least(self.role, role)


def new_form_session(*, now: float | None = None) -> Session:
    """A visitor's session before sign-in: only a CSRF token for the sign-in form."""
    return Session(csrf=secrets.token_urlsafe(24), expires=int((time.time() if now is None else now) + FORM_SECONDS))


def sign_values(values: list[Any], secret: bytes, purpose: bytes) -> str:
    """``values`` as a cookie this server signs: base64 JSON and an HMAC-SHA256 bound to ``purpose``."""
    body = _b64(json.dumps(values).encode())
    return f"{body}.{_sign(body, secret, purpose)}"


def signed_values(cookie: str | None, secret: bytes, purpose: bytes) -> list[Any] | None:
    """The values of a cookie ``sign_values`` made for ``purpose``, or None (missing, forged, malformed)."""
    if not cookie or "." not in cookie:
        return None
    body, _, signature = cookie.rpartition(".")
    if not hmac.compare_digest(signature, _sign(body, secret, purpose)):
        return None
    try:
        values = json.loads(_unb64(body))
    except (ValueError, TypeError):
        return None
    return values if isinstance(values, list) else None


def encode_form_session(session: Session, secret: bytes) -> str:
    return sign_values([session.csrf, session.expires], secret, FORM_PURPOSE)


def decode_form_session(cookie: str | None, secret: bytes, *, now: float | None = None) -> Session | None:
    """The sign-in form's session in a cookie this server signed, or None (missing, forged, malformed, expired)."""
    values = signed_values(cookie, secret, FORM_PURPOSE)
    if values is None or len(values) != 2:
        return None
    csrf, expires = values
    if int(expires) < (time.time() if now is None else now):
        return None
    return Session(csrf=str(csrf), expires=int(expires))


def csrf_ok(session: Session | None, presented: str | None) -> bool:
    return session is not None and bool(presented) and hmac.compare_digest(session.csrf, str(presented))


FORM_PURPOSE = b"console-form:"


def _sign(body: str, secret: bytes, purpose: bytes) -> str:
    return hmac.new(secret, purpose + body.encode(), hashlib.sha256).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
