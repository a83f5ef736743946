"""The audit chain: each entry carries an HMAC-SHA256 of its content and of the entry before it.

The key is kept out of the database (``REFUND_AGENT_AUDIT_KEY``), so whoever can write the database can
neither change an entry nor recompute the chain after it. Entries written before the chain had a key carry a
plain SHA-256; a chain may hold only as many as it is told to allow (none by default), and only as its prefix:
the first keyed entry's MAC covers the last of them, and an unkeyed entry after a keyed one is what a rewrite
without the key looks like. What the MACs cannot see (the newest entries deleted) the anchor outside the
database does (``steps.audit_anchor``): each process moves it forward after its appends commit.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from steps import audit_anchor
from steps.audit_anchor import Anchor, AnchorError
from steps.records import AuditEntry
from steps.store import audit_log, utc

GENESIS = "0" * 64
AUDIT_CHAIN_LOCK = 7_261_002
MIN_KEY_BYTES = 32

_key: bytes | None = None
_anchor: Path | None = None
_unkeyed_allowed = 0


class AuditKeyMissing(RuntimeError):
    """This process appends to the chain without a key: it would write an entry anyone could forge."""


def use_key(key: bytes | None) -> None:
    """The key this process appends and verifies with (``agent.runtime.start`` sets it from the settings)."""
    global _key
    if key is not None and len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the audit key must be at least {MIN_KEY_BYTES} bytes")
    _key = key


def use_anchor(path: Path | None, *, unkeyed_allowed: int = 0) -> None:
    """Anchor this process's appends at ``path`` (begun at no entries when there is none) and check the chain
    against it; ``unkeyed_allowed``: how many entries at the chain's start may predate the key (0: none).

    Needs the key first (``use_key``). ``agent.runtime.start`` sets both from the settings.
    """
    global _anchor, _unkeyed_allowed
    if path is not None:
        audit_anchor.ensure(path, _current_key())
    _anchor, _unkeyed_allowed = path, unkeyed_allowed


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
    advisory lock (released at commit); on SQLite on the database's write lock, taken before the head is read.
    Take any row lock the transaction needs before appending: a transaction that holds the chain's
    lock while it waits for a row another appender has locked deadlocks with it.

    Without this process's audit key (``use_key``) it raises ``AuditKeyMissing`` and writes nothing.
    """
    key = _current_key()
    dialect = session.dialect if isinstance(session, sa.Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        session.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_CHAIN_LOCK})
    else:
        # The driver begins SQLite's IMMEDIATE transaction (the write lock) only at a write: write nothing first, so
        # the head is read under the lock, not beside another process about to append the same seq.
        session.execute(audit_log.update().where(sa.false()).values(seq=audit_log.c.seq))
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
    if _anchor is not None:  # moved once this commits, when the connection is handed back
        conn = session if isinstance(session, sa.Connection) else session.connection()
        audit_anchor.note_append(conn, _anchor, key, Anchor(seq, digest))
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
    anchored: int | None = None
    """The entry count the anchor outside the database records; None when no anchor was checked."""


def verify(
    conn: sa.Connection,
    *,
    key: bytes | None = None,
    anchors: Sequence[Path] | None = None,
    unkeyed_allowed: int | None = None,
) -> ChainReport:
    """Walk the chain from the start; report the first entry whose link or MAC does not check, an unkeyed entry
    past the ``unkeyed_allowed`` first, or a chain that does not reach or does not match its anchor.

    Defaults: this process's key, anchor and allowance (``use_key``, ``use_anchor``), so the console and
    ``refund-agent audit verify`` make the same check.
    """
    key = key if key is not None else _current_key()
    paths = list(anchors) if anchors is not None else ([_anchor] if _anchor is not None else [])
    allowed = unkeyed_allowed if unkeyed_allowed is not None else _unkeyed_allowed
    try:
        # Read before the chain: an anchor only ever names committed entries, so the chain read after it holds them.
        pinned = [(path, audit_anchor.read(path, key)) for path in paths]
    except AnchorError as error:
        return ChainReport(False, 0, None, str(error))
    report = _walk(conn, key, allowed)
    if not report.ok or not pinned:
        return report
    for path, anchor in pinned:
        if anchor.entries > report.entries:
            problem = (
                f"the chain ends at entry {report.entries} but its anchor ({path}) records {anchor.entries} "
                "entries (the newest deleted?)"
            )
            return _broken(report, report.entries + 1, problem, anchor)
    at = {anchor.entries for _, anchor in pinned if anchor.entries}
    rows = conn.execute(sa.select(audit_log.c.seq, audit_log.c.hash).where(audit_log.c.seq.in_(at)))
    macs: dict[int, str] = {row.seq: row.hash for row in rows}
    for path, anchor in pinned:
        if anchor.entries and not hmac.compare_digest(macs.get(anchor.entries, ""), anchor.last_mac):
            problem = f"entry {anchor.entries} is not the one its anchor ({path}) records (the chain rewritten?)"
            return _broken(report, anchor.entries, problem, anchor)
    return ChainReport(True, report.entries, unkeyed=report.unkeyed, anchored=max(a.entries for _, a in pinned))


def _broken(report: ChainReport, seq: int, problem: str, anchor: Anchor) -> ChainReport:
    return ChainReport(False, report.entries, seq, problem, report.unkeyed, anchor.entries)


def _walk(conn: sa.Connection, key: bytes, unkeyed_allowed: int) -> ChainReport:
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
            if unkeyed >= unkeyed_allowed:
                problem = (
                    f"hashed without the audit key, and only the first {unkeyed_allowed} entries may be "
                    "(from before the key; a chain rewritten without it?)"
                )
                return ChainReport(False, count, row.seq, problem, unkeyed)
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
