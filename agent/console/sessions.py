"""Signed-in sessions: started at sign-in, checked on every request against their row and the operators
configured now, ended by sign-out, revocation, idleness, their lifetime, or a change to the operator.

Everything that starts or ends a session, and every failed sign-in, is written to the audit log as a
service-wide entry (``refund_id=""``) in the transaction that makes the change: the operator's name (or
``None`` for a name that is not an operator's, which may be a mistyped password), the client address,
and the session's label (the first characters of its id's hash). Never a password.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from agent.console import auth
from steps import audit, console_sessions, sign_in_throttle
from steps.console_sessions import OperatorSession
from steps.store import app_db

log = logging.getLogger(__name__)


def _audit(conn: sa.Connection, event: str, payload: dict[str, Any], now: datetime) -> None:
    audit.append(conn, refund_id="", event=event, payload=payload, now=now)


def backed(operators: Mapping[str, auth.Operator]) -> dict[str, str]:
    """Operator -> the credentials fingerprint a session of theirs must carry to stay valid."""
    return {name: auth.credentials(operator) for name, operator in operators.items()}


def _why_ended(
    row: OperatorSession, operators: Mapping[str, auth.Operator], oidc: str | None, now: datetime
) -> str | None:
    operator = operators.get(row.operator)
    if row.credentials.startswith("oidc:"):  # signed in through the provider: its role was mapped then
        if row.credentials != oidc:
            return "sign-in provider or its role mapping changed"
    elif operator is None:
        return "operator removed"
    elif auth.credentials(operator) != row.credentials:
        return "role or password changed"
    if row.ended(now, auth.SESSION_IDLE):
        return "expired"
    return None


def current(
    session_id: str, operators: Mapping[str, auth.Operator], address: str, oidc: str | None = None
) -> auth.Session | None:
    """The signed-in session the cookie names, if its row exists, has not ended, and the operator is still
    configured with the credentials it signed in with (for one signed in through the provider: the provider
    and role mapping configured now, ``oidc``); a session that fails any of these is deleted."""
    now = datetime.now(UTC)
    key = console_sessions.session_hash(session_id)
    with app_db().engine.connect() as conn:
        row = console_sessions.find(conn, key)
    if row is None:
        return None
    reason = _why_ended(row, operators, oidc, now)
    if reason is not None:
        with app_db().engine.begin() as conn:
            ended = console_sessions.delete(conn, key)
            if ended is not None and reason != "expired":
                payload = {"operator": row.operator, "session": row.label, "reason": reason, "address": address}
                _audit(conn, "console_session_ended", payload, now)
        log.info("console: session %s of %s ended: %s", row.label, row.operator, reason)
        return None
    if now - row.last_seen_at >= auth.SESSION_TOUCH_EVERY:
        with app_db().engine.begin() as conn:
            console_sessions.touch(conn, key, now)
    role: auth.Role = operators[row.operator].role if row.operator in operators else _role(row.role)
    return auth.Session(
        csrf=row.csrf, expires=int(row.expires_at.timestamp()), operator=row.operator, role=role, ref=key
    )


def _role(text: str) -> auth.Role:
    return next(role for role in auth.ROLES if role == text)


def start(
    operator: auth.Operator,
    *,
    name_digest: str,
    address: str,
    user_agent: str,
    replacing: auth.Session | None,
    oidc: str | None = None,
    identity: Mapping[str, Any] | None = None,
) -> str:
    """Sign the operator in: a new session (and CSRF token); the cookie's value is returned. A session the
    browser already had ends (signing in always starts afresh). Through the provider: ``oidc`` is the
    session's fingerprint and ``identity`` (subject, email, groups) goes into the audit entry."""
    now = datetime.now(UTC)
    session_id = secrets.token_urlsafe(32)
    with app_db().engine.begin() as conn:
        sign_in_throttle.attempt_succeeded(conn, name_digest=name_digest, address=address)
        console_sessions.delete_ended(conn, now=now, idle=auth.SESSION_IDLE)
        if replacing is not None and replacing.ref is not None:
            old = console_sessions.delete(conn, replacing.ref)
            if old is not None:
                payload = {"operator": old.operator, "session": old.label, "reason": "signed in again"}
                _audit(conn, "console_signed_out", {**payload, "address": address}, now)
        created = console_sessions.create(
            conn,
            session_id=session_id,
            operator=operator.name,
            role=operator.role,
            credentials=oidc or auth.credentials(operator),
            csrf=secrets.token_urlsafe(24),
            address=address,
            user_agent=user_agent,
            now=now,
            lifetime=auth.SESSION_LIFETIME,
        )
        payload = {"operator": operator.name, "role": operator.role, "session": created.label, "address": address}
        _audit(conn, "console_signed_in", {**payload, **(identity or {})}, now)
    log.info("console: %s signed in (%s) from %s", operator.name, operator.role, address)
    return session_id


def sign_in_failed(known_name: str | None, address: str, attempt: sign_in_throttle.Attempt) -> None:
    """Record a failed sign-in, and the start of the name's backoff or the address's limit it caused."""
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        _audit(conn, "console_sign_in_failed", {"operator": known_name, "address": address}, now)
        if attempt.name_failures == auth.BACKOFF.free_failures:
            payload = {
                "operator": known_name,
                "address": address,
                "failures": attempt.name_failures,
                "retry_after_seconds": int(attempt.delay.total_seconds()),
            }
            _audit(conn, "console_sign_in_backoff", payload, now)
        if attempt.address_failures == auth.ADDRESS_LIMIT.failures:
            payload = {"address": address, "failures": attempt.address_failures}
            _audit(conn, "console_sign_in_address_limited", payload, now)
    log.warning("console: failed sign-in from %s", address)  # the name field may hold a mistyped password


def revoke(key: str, *, event: str, by: str, address: str) -> OperatorSession | None:
    """Delete the session whose hash is ``key``; what was deleted, or None when it had already ended."""
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        ended = console_sessions.delete(conn, key)
        if ended is not None:
            payload = {"operator": by, "address": address, "session": ended.label}
            if event != "console_signed_out":
                payload |= {"session_operator": ended.operator, "session_address": ended.address}
            _audit(conn, event, payload, now)
    if ended is not None:
        log.info("console: session %s of %s ended by %s (%s)", ended.label, ended.operator, by, event)
    return ended


def active(operators: Mapping[str, auth.Operator], seen_by: str, oidc: str | None = None) -> list[OperatorSession]:
    """The sessions that can still be used, most recently used first; on the way, the ones that cannot
    (ended, or no longer backed by the configuration) are deleted. ``seen_by``: the admin listing them."""
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        console_sessions.delete_ended(conn, now=now, idle=auth.SESSION_IDLE)
        fingerprints = backed(operators)
        if oidc is not None:  # sessions through the provider are backed by its configuration as it is now
            rows = console_sessions.all_sessions(conn)
            fingerprints |= {row.operator: oidc for row in rows if row.credentials == oidc}
        for row in console_sessions.delete_unbacked(conn, fingerprints):
            reason = "operator removed" if row.operator not in operators else "role or password changed"
            payload = {"operator": row.operator, "session": row.label, "reason": reason, "seen_by": seen_by}
            _audit(conn, "console_session_ended", {**payload, "session_address": row.address}, now)
        return console_sessions.all_sessions(conn)
