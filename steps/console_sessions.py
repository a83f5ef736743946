"""Console sessions as rows: created at sign-in, read on every request, deleted at sign-out or revocation.

The browser holds a random session id; the table keeps only its SHA-256, so a copy of the table signs no
one in. Every function works inside the caller's transaction (``conn``), so an audit entry describing the
change commits with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from steps.store import console_sessions, utc

USER_AGENT_CHARS = 300


def session_hash(session_id: str) -> str:
    """What the table keeps of a session id (the cookie's value)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class OperatorSession:
    session_hash: str
    operator: str
    role: str
    credentials: str
    """A fingerprint of the operator's role and password hash at sign-in."""
    csrf: str
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    """The absolute end; idleness ends the session sooner (see ``idle_ends_at``)."""
    address: str
    user_agent: str

    @property
    def label(self) -> str:
        """A short name for the session in pages and the audit log (not enough to present it)."""
        return self.session_hash[:12]

    def idle_ends_at(self, idle: timedelta) -> datetime:
        return min(self.last_seen_at + idle, self.expires_at)

    def ended(self, now: datetime, idle: timedelta) -> bool:
        return now >= self.idle_ends_at(idle)


def _session(row: sa.Row[Any]) -> OperatorSession:
    return OperatorSession(
        session_hash=str(row.session_hash),
        operator=str(row.operator),
        role=str(row.role),
        credentials=str(row.credentials),
        csrf=str(row.csrf),
        created_at=utc(row.created_at),
        last_seen_at=utc(row.last_seen_at),
        expires_at=utc(row.expires_at),
        address=str(row.address),
        user_agent=str(row.user_agent),
    )


def create(
    conn: sa.Connection,
    *,
    session_id: str,
    operator: str,
    role: str,
    credentials: str,
    csrf: str,
    address: str,
    user_agent: str,
    now: datetime,
    lifetime: timedelta,
) -> OperatorSession:
    session = OperatorSession(
        session_hash=session_hash(session_id),
        operator=operator,
        role=role,
        credentials=credentials,
        csrf=csrf,
        created_at=now,
        last_seen_at=now,
        expires_at=now + lifetime,
        address=address[:64],
        user_agent=user_agent[:USER_AGENT_CHARS],
    )
    conn.execute(console_sessions.insert().values(**asdict(session)))
    return session


def find(conn: sa.Connection, key: str) -> OperatorSession | None:
    """The session whose hash is ``key``, ended or not (the caller judges it)."""
    row = conn.execute(sa.select(console_sessions).where(console_sessions.c.session_hash == key)).first()
    return _session(row) if row is not None else None


def touch(conn: sa.Connection, key: str, now: datetime) -> None:
    """The session was used now: its idle time starts again."""
    conn.execute(console_sessions.update().where(console_sessions.c.session_hash == key).values(last_seen_at=now))


def delete(conn: sa.Connection, key: str) -> OperatorSession | None:
    """End the session; the row as it was when this call deleted it, or None when it was already gone."""
    found = conn.execute(sa.select(console_sessions).where(console_sessions.c.session_hash == key)).first()
    if found is None:
        return None
    deleted = conn.execute(console_sessions.delete().where(console_sessions.c.session_hash == key)).rowcount
    return _session(found) if deleted else None  # a concurrent sign-out may have deleted it first


def delete_ended(conn: sa.Connection, *, now: datetime, idle: timedelta) -> int:
    """Delete the sessions past their absolute end or idle for longer than ``idle``."""
    ended = sa.or_(console_sessions.c.expires_at <= now, console_sessions.c.last_seen_at <= now - idle)
    return int(conn.execute(console_sessions.delete().where(ended)).rowcount)


def delete_unbacked(conn: sa.Connection, credentials: Mapping[str, str]) -> list[OperatorSession]:
    """Delete the sessions of operators not in ``credentials`` (operator -> fingerprint) or whose
    fingerprint differs (their role or password changed); the sessions this call deleted."""
    ended = []
    for session in all_sessions(conn):
        if credentials.get(session.operator) != session.credentials and delete(conn, session.session_hash):
            ended.append(session)
    return ended


def all_sessions(conn: sa.Connection) -> list[OperatorSession]:
    """Every session row, most recently used first (ended ones too, until something deletes them)."""
    query = sa.select(console_sessions).order_by(
        console_sessions.c.last_seen_at.desc(), console_sessions.c.session_hash
    )
    return [_session(row) for row in conn.execute(query)]
