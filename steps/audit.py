"""The audit chain: each entry carries an HMAC-SHA256 of its content and of the entry before it.

The key is kept out of the database (``REFUND_AGENT_AUDIT_KEY``), so whoever can write the database can
neither change an entry nor recompute the chain after it. Entries written before the chain had a key carry a
plain SHA-256 and are accepted only as the chain's prefix: the first keyed entry's MAC covers the last of them,
and an unkeyed entry after a keyed one is what a rewrite without the key looks like.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from steps.records import AuditEntry
from steps.store import audit_log, utc

GENESIS = "0" * 64
AUDIT_CHAIN_LOCK = 7_261_002
MIN_KEY_BYTES = 32

_key: bytes | None = None


class AuditKeyMissing(RuntimeError):
    """This process appends to the chain without a key: it would write an entry anyone could forge."""


def use_key(key: bytes | None) -> None:
    """The key this process appends and verifies with (``agent.runtime.start`` sets it from the settings)."""
    global _key
    if key is not None and len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the audit key must be at least {MIN_KEY_BYTES} bytes")
    _key = key


def _current_key() -> bytes:
    if _key is None:
        raise AuditKeyMissing("no audit key in this process: call steps.audit.use_key (agent.runtime.start does)")
    return _key


def _body(seq: int, refund_id: str, event: str, payload: str, created_at: datetime, prev: str) -> bytes:
    return json.dumps(
        [seq, refund_id, event, payload, utc(created_at).isoformat(), prev], separators=(",", ":")
    ).encode()


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def _unkeyed(body: bytes) -> str:
    """How entries were hashed before the chain had a key."""
    return hashlib.sha256(body).hexdigest()


def append(
    session: sa.Connection | Session, *, refund_id: str, event: str, payload: dict[str, Any], now: datetime
) -> str:
    """Append one entry inside the caller's transaction, so it commits with the change it describes.

    The chain is a total order: on Postgres concurrent appenders queue on a transaction-scoped
    advisory lock (released at commit); SQLite's IMMEDIATE transactions already serialize writers.
    Take any row lock the transaction needs before appending: a transaction that holds the chain's
    lock while it waits for a row another appender has locked deadlocks with it.

    Without this process's audit key (``use_key``) it raises ``AuditKeyMissing`` and writes nothing.
    """
    key = _current_key()
    dialect = session.dialect if isinstance(session, sa.Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        session.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_CHAIN_LOCK})
    last = session.execute(
        sa.select(audit_log.c.seq, audit_log.c.hash).order_by(audit_log.c.seq.desc()).limit(1)
    ).first()
    seq, prev = (last.seq + 1, last.hash) if last else (1, GENESIS)
    text = json.dumps(payload, sort_keys=True, default=str)
    digest = _mac(key, _body(seq, refund_id, event, text, now, prev))
    session.execute(
        audit_log.insert().values(
            seq=seq,
            refund_id=refund_id,
            event=event,
            payload=text,
            created_at=now,
            prev_hash=prev,
            hash=digest,
        )
    )
    return digest


def _entry(row: Any) -> AuditEntry:
    return AuditEntry(
        seq=row.seq,
        refund_id=row.refund_id,
        event=row.event,
        payload=json.loads(row.payload),
        created_at=utc(row.created_at),
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


def entries(conn: sa.Connection, refund_id: str | None = None) -> list[AuditEntry]:
    query = sa.select(audit_log).order_by(audit_log.c.seq)
    if refund_id is not None:
        query = query.where(audit_log.c.refund_id == refund_id)
    return [_entry(row) for row in conn.execute(query)]


ACTOR_FIELDS = ("operator", "approver", "requested_by", "by")
"""The payload fields that name who acted: an operator, an approver, the client that asked, an admin."""


@dataclass(frozen=True)
class AuditFilter:
    refund_id: str | None = None
    actor: str | None = None
    """A principal (``operator:ada``) or a bare name (``ada``, matching any kind of principal of that name)."""
    event: str | None = None
    since: datetime | None = None
    """Inclusive."""
    until: datetime | None = None
    """Exclusive."""


def _field(conn: sa.Connection, name: str) -> sa.ColumnElement[str]:
    """A top-level text field of the JSON payload (stored as text) in this database's SQL."""
    if conn.dialect.name == "postgresql":
        text: sa.ColumnElement[str] = sa.cast(audit_log.c.payload, JSONB)[name].astext
        return text
    extracted: sa.ColumnElement[str] = sa.func.json_extract(audit_log.c.payload, f"$.{name}", type_=sa.String)
    return extracted


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def search(conn: sa.Connection, flt: AuditFilter, *, offset: int = 0, limit: int = 50) -> list[AuditEntry]:
    """Entries across refunds that match every filter given, newest first."""
    query = sa.select(audit_log).order_by(audit_log.c.seq.desc())
    if flt.refund_id is not None:
        query = query.where(audit_log.c.refund_id == flt.refund_id)
    if flt.event is not None:
        query = query.where(audit_log.c.event == flt.event)
    if flt.since is not None:
        query = query.where(audit_log.c.created_at >= flt.since)
    if flt.until is not None:
        query = query.where(audit_log.c.created_at < flt.until)
    if flt.actor:
        matches: list[sa.ColumnElement[bool]] = []
        for field in (_field(conn, name) for name in ACTOR_FIELDS):
            matches.append(field == flt.actor)
            if ":" not in flt.actor:  # a bare name: that name as any kind of principal
                matches.append(field.like(f"%:{_like_escaped(flt.actor)}", escape="\\"))
        query = query.where(sa.or_(*matches))
    return [_entry(row) for row in conn.execute(query.offset(offset).limit(limit))]


def event_names(conn: sa.Connection) -> list[str]:
    """Every kind of event the log holds, for a filter's choices."""
    return list(conn.execute(sa.select(audit_log.c.event).distinct().order_by(audit_log.c.event)).scalars())


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    entries: int
    first_broken_seq: int | None = None
    problem: str = ""
    unkeyed: int = 0
    """Entries from before the chain had a key (plain SHA-256), all at its start."""


def verify(conn: sa.Connection, *, key: bytes | None = None) -> ChainReport:
    """Walk the chain from the start; report the first entry whose link or MAC does not check.

    ``key``: the audit key; by default this process's (``use_key``).
    """
    key = key if key is not None else _current_key()
    prev, expected_seq, count, unkeyed, keyed_seen = GENESIS, 1, 0, 0, False
    for row in conn.execute(sa.select(audit_log).order_by(audit_log.c.seq)):
        count += 1
        if row.seq != expected_seq:
            return ChainReport(False, count, row.seq, f"entry {expected_seq} is missing", unkeyed)
        if row.prev_hash != prev:
            return ChainReport(False, count, row.seq, "prev_hash does not match the previous entry", unkeyed)
        body = _body(row.seq, row.refund_id, row.event, row.payload, row.created_at, row.prev_hash)
        if hmac.compare_digest(_mac(key, body), row.hash):
            keyed_seen = True
        elif hmac.compare_digest(_unkeyed(body), row.hash):
            if keyed_seen:
                return ChainReport(
                    False, count, row.seq, "hashed without the audit key after keyed entries (rewritten?)", unkeyed
                )
            unkeyed += 1
        else:
            return ChainReport(
                False,
                count,
                row.seq,
                "content does not match its MAC (or the audit key is not the one it was written with)",
                unkeyed,
            )
        prev, expected_seq = row.hash, expected_seq + 1
    return ChainReport(True, count, unkeyed=unkeyed)
