"""Console sign-in: scrypt password hashes, HMAC-signed session cookies with a CSRF token, roles,
and a limit on failed sign-ins."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from functools import cache

from agent.identity import ROLES, Operator, Role, parse_operators, role_at_least

__all__ = ["ROLES", "Operator", "Role", "parse_operators"]

SESSION_COOKIE = "refund_console"
SESSION_SECONDS = 12 * 3600
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


@cache
def _dummy_hash() -> str:
    """Checked when the name is unknown, so a wrong name costs the same time as a wrong password."""
    return hash_password("not a real password", salt=b"\x00" * 16)


def authenticate(operators: dict[str, Operator], name: str, password: str) -> Operator | None:
    operator = operators.get(name)
    ok = check_password(password, operator.password_hash if operator else _dummy_hash())
    return operator if ok and operator else None


@dataclass(frozen=True)
class Session:
    csrf: str
    expires: int
    operator: str | None = None
    role: Role | None = None

    def may(self, role: Role) -> bool:
        """Admins may do everything approvers may; approvers everything viewers may."""
        return role_at_least(self.role, role)


def new_session(operator: Operator | None = None, *, now: float | None = None) -> Session:
    """A fresh session (and CSRF token); signing in always starts a new one."""
    expires = int((time.time() if now is None else now) + SESSION_SECONDS)
    return Session(
        csrf=secrets.token_urlsafe(24),
        expires=expires,
        operator=operator.name if operator else None,
        role=operator.role if operator else None,
    )


def encode_session(session: Session, secret: bytes) -> str:
    body = _b64(json.dumps([session.csrf, session.expires, session.operator, session.role]).encode())
    return f"{body}.{_sign(body, secret)}"


def decode_session(cookie: str | None, secret: bytes, *, now: float | None = None) -> Session | None:
    """The session in a cookie this server signed, or None (missing, forged, malformed or expired)."""
    if not cookie or "." not in cookie:
        return None
    body, _, signature = cookie.rpartition(".")
    if not hmac.compare_digest(signature, _sign(body, secret)):
        return None
    try:
        csrf, expires, operator, role = json.loads(_unb64(body))
    except (ValueError, TypeError):
        return None
    if int(expires) < (time.time() if now is None else now) or (role is not None and role not in ROLES):
        return None
    return Session(csrf=str(csrf), expires=int(expires), operator=operator, role=role)


def csrf_ok(session: Session | None, presented: str | None) -> bool:
    return session is not None and bool(presented) and hmac.compare_digest(session.csrf, str(presented))


@dataclass
class SignInLimiter:
    """Failed sign-ins in the last ``window`` seconds: at most ``per_name`` for one operator name and
    ``per_address`` from one client address; beyond that, sign-in is refused until failures age out."""

    per_name: int = 5
    per_address: int = 20
    window: float = 300.0
    _failures: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def blocked(self, name: str, address: str, *, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            for key, limit in ((f"name:{name}", self.per_name), (f"addr:{address}", self.per_address)):
                failures = self._failures[key]
                while failures and failures[0] <= now - self.window:
                    failures.popleft()
                if not failures:
                    del self._failures[key]  # made-up names must not pile up
                elif len(failures) >= limit:
                    return True
        return False

    def failed(self, name: str, address: str, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._failures[f"name:{name}"].append(now)
            self._failures[f"addr:{address}"].append(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"name:{name}", None)


def _sign(body: str, secret: bytes) -> str:
    return hmac.new(secret, b"console-session:" + body.encode(), hashlib.sha256).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
