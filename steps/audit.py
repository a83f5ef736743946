"""Hash-chained audit records: each entry commits to the one before it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from steps.records import AuditEntry
from steps.store import audit_log, utc

GENESIS = "0" * 64
AUDIT_CHAIN_LOCK = 7_261_002


def _digest(seq: int, refund_id: str, event: str, payload: str, created_at: datetime, prev: str) -> str:
    body = json.dumps([seq, refund_id, event, payload, utc(created_at).isoformat(), prev], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def append(
    session: sa.Connection | Session, *, refund_id: str, event: str, payload: dict[str, Any], now: datetime
) -> str:
    """Append one entry inside the caller's transaction, so it commits with the change it describes.

    The chain is a total order: on Postgres concurrent appenders queue on a transaction-scoped
    advisory lock (released at commit); SQLite's IMMEDIATE transactions already serialize writers.
    Take any row lock the transaction needs before appending: a transaction that holds the chain's
    lock while it waits for a row another appender has locked deadlocks with it.
    """
    dialect = session.dialect if isinstance(session, sa.Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        session.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_CHAIN_LOCK})
    last = session.execute(
        sa.select(audit_log.c.seq, audit_log.c.hash).order_by(audit_log.c.seq.desc()).limit(1)
    ).first()
    seq, prev = (last.seq + 1, last.hash) if last else (1, GENESIS)
    text = json.dumps(payload, sort_keys=True, default=str)
    digest = _digest(seq, refund_id, event, text, now, prev)
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


def entries(conn: sa.Connection, refund_id: str | None = None) -> list[AuditEntry]:
    query = sa.select(audit_log).order_by(audit_log.c.seq)
    if refund_id is not None:
        query = query.where(audit_log.c.refund_id == refund_id)
    return [
        AuditEntry(
            seq=row.seq,
            refund_id=row.refund_id,
            event=row.event,
            payload=json.loads(row.payload),
            created_at=utc(row.created_at),
            prev_hash=row.prev_hash,
            hash=row.hash,
        )
        for row in conn.execute(query)
    ]


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    entries: int
    first_broken_seq: int | None = None
    problem: str = ""


def verify(conn: sa.Connection) -> ChainReport:
    """Walk the chain from the start; report the first entry whose link or content does not check."""
    prev, expected_seq, count = GENESIS, 1, 0
    for row in conn.execute(sa.select(audit_log).order_by(audit_log.c.seq)):
        count += 1
        if row.seq != expected_seq:
            return ChainReport(False, count, row.seq, f"entry {expected_seq} is missing")
        if row.prev_hash != prev:
            return ChainReport(False, count, row.seq, "prev_hash does not match the previous entry")
        digest = _digest(row.seq, row.refund_id, row.event, row.payload, row.created_at, row.prev_hash)
        if digest != row.hash:
            return ChainReport(False, count, row.seq, "content does not match its hash")
        prev, expected_seq = row.hash, expected_seq + 1
    return ChainReport(True, count)
