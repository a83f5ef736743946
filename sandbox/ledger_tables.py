"""The sandbox payments ledger's tables (charges, refunds, idempotency keys, events, risk signals, counters) and its
engine: SQLAlchemy Core over a SQLite file or Postgres."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

metadata = sa.MetaData()
_SeqType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite only autoincrements INTEGER

charges = sa.Table(
    "sandbox_charges",
    metadata,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("amount_refunded", sa.BigInteger, nullable=False),
    sa.Column("payment_intent", sa.String(255), unique=True),
    sa.Column("created", sa.BigInteger, nullable=False),
)
refunds = sa.Table(
    "sandbox_refunds",
    metadata,
    # Insertion order gives a stable "newest first" even when several refunds share a `created` second.
    sa.Column("seq", _SeqType, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("charge", sa.String(255), nullable=False, index=True),
    sa.Column("payment_intent", sa.String(255), index=True),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("failure_reason", sa.String(64)),
    sa.Column("reason", sa.String(64)),
    sa.Column("metadata_json", sa.Text, nullable=False),
    sa.Column("created", sa.BigInteger, nullable=False),
    # A pending refund settles at settle_at (epoch seconds) into settle_to, unless settled by hand first.
    sa.Column("settle_at", sa.Float),
    sa.Column("settle_to", sa.String(32)),
    sa.Column("settle_failure_reason", sa.String(64)),
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
events = sa.Table(
    "sandbox_events",
    metadata,
    sa.Column("seq", _SeqType, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("delivered", sa.Boolean, nullable=False),
)
#: Stripe Radar early fraud warnings and disputes on charges (served by sandbox/risk.py); a charge with an open
#: dispute that is not an inquiry cannot be refunded (``apply_refund``).
risk_signals = sa.Table(
    "sandbox_risk_signals",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("charge", sa.String(255), nullable=False, index=True),
    sa.Column("created", sa.BigInteger, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)
#: Disputes that hold the charge: Stripe refuses a refund while one is open (``charge_disputed``). An inquiry
#: (``warning_*``) leaves the charge refundable, as Stripe's ``is_charge_refundable`` says.
#: A dispute in these statuses holds the charge (no refund while it is open).
CHARGEBACK_OPEN = frozenset({"needs_response", "under_review"})
counters = sa.Table(
    "sandbox_counters",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)


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
