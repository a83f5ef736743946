"""Storage for the sandbox refunds service: refunds, idempotency keys and counters.

SQLAlchemy Core over a SQLite file or Postgres, so several sandbox processes (and threads) can share
one database and still agree on idempotency and statistics.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger(__name__)

COUNTERS = ("create_requests", "refunds_applied", "replays", "faults_injected")
_PG_SCHEMA_LOCK = 0x5A4E_D80C  # arbitrary advisory-lock id serialising concurrent create_all on Postgres

metadata = sa.MetaData()
_SeqType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite only autoincrements INTEGER

refunds = sa.Table(
    "sandbox_refunds",
    metadata,
    # Insertion order gives a stable "newest first" even when several refunds share a `created` second.
    sa.Column("seq", _SeqType, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("charge", sa.String(255), nullable=False, index=True),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reason", sa.String(64)),
    sa.Column("metadata_json", sa.Text, nullable=False),
    sa.Column("created", sa.BigInteger, nullable=False),
)
# Metadata is duplicated as rows so the list endpoint can filter on it portably in SQL.
refund_metadata = sa.Table(
    "sandbox_refund_metadata",
    metadata,
    sa.Column("refund_id", sa.String(64), sa.ForeignKey("sandbox_refunds.id"), primary_key=True),
    sa.Column("key", sa.String(40), primary_key=True),
    sa.Column("value", sa.String(500), nullable=False),
    sa.Index("ix_sandbox_refund_metadata_kv", "key", "value"),
)
idempotency_keys = sa.Table(
    "sandbox_idempotency_keys",
    metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("token", sa.String(32), nullable=False),  # identifies the current claim holder
    sa.Column("state", sa.String(16), nullable=False),  # "in_flight" | "done"
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.Column("response_status", sa.Integer),
    sa.Column("response_body", sa.Text),
)
counters = sa.Table(
    "sandbox_counters",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)


@dataclass(frozen=True)
class Refund:
    id: str
    charge: str
    amount: int
    currency: str
    reason: str | None
    metadata: dict[str, str]
    created: int
    status: str = "succeeded"

    def to_stripe(self) -> dict[str, Any]:
        fields = ("amount", "currency", "charge", "status", "reason", "metadata", "created")
        return {"id": self.id, "object": "refund"} | {f: getattr(self, f) for f in fields}


@dataclass(frozen=True)
class Claimed:
    """The caller now owns the key and must either apply (storing a response) or release it."""

    token: str


@dataclass(frozen=True)
class Replay:
    status_code: int
    body: str


@dataclass(frozen=True)
class Conflict:
    reason: Literal["in_flight", "mismatch"]


ClaimResult = Claimed | Replay | Conflict


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy emit BEGIN itself (see _sqlite_begin); WAL lets readers proceed during writes.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA journal_mode=WAL")


def _sqlite_begin(conn: Connection) -> None:
    # IMMEDIATE takes the write lock up front: avoids SQLITE_BUSY lock-upgrade deadlocks between
    # threads/processes that read then write in the same transaction.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(database_url: str) -> Engine:
    url = sa.make_url(database_url)
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")  # psycopg 3 is the driver we ship
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise ValueError("the sandbox ledger needs a SQLite file (shared across threads), not :memory:")
        engine = sa.create_engine(url, connect_args={"timeout": 30.0})
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine
    if backend == "postgresql":
        return sa.create_engine(url, pool_pre_ping=True)
    raise ValueError(f"unsupported sandbox database backend {backend!r} (use sqlite or postgresql)")


class Ledger:
    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)
        self._pg = self.engine.dialect.name == "postgresql"

    def create_tables(self) -> None:
        with self.engine.begin() as conn:
            if self._pg:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SCHEMA_LOCK})
            metadata.create_all(conn)
        logger.info("sandbox ledger ready at %s", self.engine.url.render_as_string(hide_password=True))

    def close(self) -> None:
        self.engine.dispose()

    def _insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    def _bump(self, conn: Connection, name: str, n: int) -> None:
        stmt = self._insert(counters).values(name=name, value=n)
        conn.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"value": counters.c.value + n}))

    def bump(self, name: str, n: int = 1) -> None:
        with self.engine.begin() as conn:
            self._bump(conn, name, n)

    def stats(self) -> dict[str, int]:
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(counters.c.name, counters.c.value)).all()
        found = {str(r.name): int(r.value) for r in rows}
        return {name: found.get(name, 0) for name in COUNTERS}

    def claim_key(
        self, key: str, fingerprint: str, *, now: float, ttl_seconds: float, stale_after_seconds: float
    ) -> ClaimResult:
        """Atomically claim `key` (unique-key insert) or report what it already holds."""
        token = secrets.token_hex(16)
        fresh = dict(fingerprint=fingerprint, token=token, state="in_flight", claimed_at=now)
        fresh |= dict(response_status=None, response_body=None)
        keys = idempotency_keys
        for _ in range(10):  # the row may be released between our insert attempt and our read: retry
            with self.engine.begin() as conn:
                # RETURNING, not rowcount: SQLAlchemy only guarantees rowcount for UPDATE/DELETE.
                insert = self._insert(keys).values(key=key, **fresh).on_conflict_do_nothing()
                if conn.execute(insert.returning(keys.c.key)).first() is not None:
                    return Claimed(token)
                row = conn.execute(sa.select(keys).where(keys.c.key == key)).one_or_none()
                if row is None:
                    continue
                age = now - row.claimed_at
                # A crashed holder must not pin the key forever; the token check in apply_refund keeps
                # a slow-but-alive holder from committing after being taken over.
                expired = age >= ttl_seconds or (row.state == "in_flight" and age >= stale_after_seconds)
                if not expired:
                    if row.state == "in_flight":
                        return Conflict("in_flight")
                    if row.fingerprint != fingerprint:
                        return Conflict("mismatch")
                    return Replay(int(row.response_status), str(row.response_body))
                retaken = conn.execute(
                    sa.update(keys).where(keys.c.key == key, keys.c.token == row.token).values(**fresh)
                )
                if retaken.rowcount == 1:
                    return Claimed(token)
        raise RuntimeError("could not claim idempotency key: too much contention")

    def release_key(self, key: str, token: str) -> None:
        keys = idempotency_keys
        with self.engine.begin() as conn:
            conn.execute(sa.delete(keys).where(keys.c.key == key, keys.c.token == token, keys.c.state == "in_flight"))

    def apply_refund(
        self, refund: Refund, *, claim: tuple[str, str] | None, response_status: int, response_body: str
    ) -> bool:
        """Insert the refund and store the idempotent response in one transaction.

        Returns False, applying nothing, when the claim (key, token) was taken over meanwhile.
        """
        keys = idempotency_keys
        with self.engine.connect() as conn:  # explicit commit: a lost claim must roll back everything
            if claim is not None:
                key, token = claim
                done = conn.execute(
                    sa.update(keys)
                    .where(keys.c.key == key, keys.c.token == token, keys.c.state == "in_flight")
                    .values(state="done", response_status=response_status, response_body=response_body)
                )
                if done.rowcount != 1:
                    conn.rollback()
                    return False
            values = {c.name: getattr(refund, c.name) for c in refunds.c if hasattr(refund, c.name)}
            conn.execute(refunds.insert().values(**values, metadata_json=json.dumps(refund.metadata)))
            if refund.metadata:
                md = [{"refund_id": refund.id, "key": k, "value": v} for k, v in refund.metadata.items()]
                conn.execute(refund_metadata.insert(), md)
            self._bump(conn, "refunds_applied", 1)
            conn.commit()
        return True

    def get_refund(self, refund_id: str) -> Refund | None:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(refunds).where(refunds.c.id == refund_id)).one_or_none()
        return None if row is None else _to_refund(row)

    def list_refunds(
        self,
        *,
        charge: str | None = None,
        metadata_filter: Mapping[str, str] | None = None,
        limit: int = 10,
        starting_after: str | None = None,
    ) -> tuple[list[Refund], bool]:
        """Newest first; returns (page, has_more)."""
        query = sa.select(refunds)
        if charge is not None:
            query = query.where(refunds.c.charge == charge)
        for k, v in (metadata_filter or {}).items():
            md = refund_metadata
            query = query.where(sa.exists().where(md.c.refund_id == refunds.c.id, md.c.key == k, md.c.value == v))
        if starting_after is not None:
            cursor = sa.select(refunds.c.seq).where(refunds.c.id == starting_after).scalar_subquery()
            query = query.where(refunds.c.seq < cursor)
        with self.engine.begin() as conn:
            rows = conn.execute(query.order_by(refunds.c.seq.desc()).limit(limit + 1)).all()
        return [_to_refund(r) for r in rows[:limit]], len(rows) > limit

    def count_refunds(self, *, charge: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(refunds)
        if charge is not None:
            query = query.where(refunds.c.charge == charge)
        with self.engine.begin() as conn:
            return int(conn.execute(query).scalar_one())


def _to_refund(row: sa.Row[Any]) -> Refund:
    values = {k: v for k, v in row._mapping.items() if k not in ("seq", "metadata_json")}
    return Refund(**values, metadata=json.loads(row.metadata_json))
