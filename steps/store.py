"""The application database: schema, engines and the DBOS datasource its steps write through."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from typing import Any, Concatenate, Literal, ParamSpec, TypedDict, TypeVar

import psycopg
import sqlalchemy as sa
import sqlalchemy.exc
from dbos import DBOS, SQLAlchemyDatasource
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

metadata = sa.MetaData()

customers = sa.Table(
    "customers",
    metadata,
    sa.Column("customer_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("email", sa.String(320), nullable=False),
    # The email as one mailbox (steps.records.email_key), written with the row (migration 0013): one claimant
    # under two customer ids is found by it.
    sa.Column("email_key", sa.String(320), nullable=False, server_default="", index=True),
)

orders = sa.Table(
    "orders",
    metadata,
    sa.Column("order_id", sa.String(64), primary_key=True),
    sa.Column("customer_id", sa.String(64), sa.ForeignKey("customers.customer_id"), nullable=False, index=True),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("amount_captured_minor", sa.BigInteger, nullable=False),
    sa.Column("amount_refunded_minor", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("paid_at", sa.DateTime(timezone=True)),
    sa.Column("charge_id", sa.String(64), nullable=False),
    sa.Column("items", sa.JSON, nullable=False),
    sa.Column("notes", sa.Text, nullable=False, server_default=""),
    # The shipment (migration 0012): empty for orders never shipped, or from before.
    sa.Column("carrier", sa.String(32), nullable=False, server_default=""),
    sa.Column("tracking_code", sa.String(64), nullable=False, server_default=""),
    # Who the order went to and what paid for it (migration 0013): the shipping address as typed and as one
    # address (steps.records.address_key), and the card's fingerprint. Empty on orders from before.
    sa.Column("shipping_address", sa.Text, nullable=False, server_default=""),
    sa.Column("address_key", sa.String(400), nullable=False, server_default="", index=True),
    sa.Column("card_fingerprint", sa.String(64), nullable=False, server_default="", index=True),
)

refunds = sa.Table(
    "refunds",
    metadata,
    sa.Column("refund_id", sa.String(200), primary_key=True),  # = workflow id = Idempotency-Key
    sa.Column("order_id", sa.String(64), nullable=False),
    sa.Column("request_hash", sa.String(64), nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("requested_amount_minor", sa.BigInteger),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("proposed_amount_minor", sa.BigInteger),
    sa.Column("verdict", sa.String(32)),
    sa.Column("reason", sa.Text),
    sa.Column("customer_reply", sa.Text),
    sa.Column("model", sa.String(200)),
    # What deciding the refund cost at the model (migration 0007); NULL before it was recorded.
    sa.Column("model_requests", sa.Integer),
    sa.Column("input_tokens", sa.BigInteger),
    sa.Column("output_tokens", sa.BigInteger),
    sa.Column("provider_refund_id", sa.String(64)),
    sa.Column("idempotency_key", sa.String(300)),
    sa.Column("payment_started_at", sa.DateTime(timezone=True)),
    # The provider's word on the refund: pending / requires_action (settling), succeeded, failed, canceled.
    sa.Column("provider_status", sa.String(32)),
    sa.Column("provider_failure_reason", sa.String(64)),
    # Held against the order from the moment the payment is prepared until it is recorded or abandoned.
    sa.Column("reserved_amount_minor", sa.BigInteger),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    # Who asked (migration 0009): the principal that submitted it (``client:helpdesk``, ``cli:root``) and the
    # operator that client acts for, if any. Neither may decide it. NULL on refunds from before.
    sa.Column("requested_by", sa.String(200)),
    sa.Column("requester_operator", sa.String(100)),
    # The claim as the agent categorised it and the evidence its look-ups returned (migration 0012); NULL before.
    sa.Column("claim_category", sa.String(32)),
    sa.Column("evidence", sa.JSON),
    # A customer's history reads the newest refunds of each order; reservations sum an order's refunds.
    sa.Index("ix_refunds_order_id_created_at", "order_id", "created_at"),
    sa.Index("ix_refunds_provider_refund_id", "provider_refund_id"),  # a provider's webhook names its refund
)

# One live process per DBOS executor id (agent/ops/heartbeat.py): a lease renewed on the database clock.
executor_leases = sa.Table(
    "executor_leases",
    metadata,
    sa.Column("executor_id", sa.String(200), primary_key=True),
    sa.Column("token", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # running | stopped | recovering | recovered
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("app_version", sa.String(100), nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("started_ms", sa.BigInteger, nullable=False),
    sa.Column("beat_ms", sa.BigInteger, nullable=False),
)

# What a parked refund waits on: written with the verdict, read by approvers, the deadline and the escalation.
approval_requests = sa.Table(
    "approval_requests",
    metadata,
    sa.Column("refund_id", sa.String(200), primary_key=True),
    sa.Column("amount_minor", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("escalate_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("escalated_at", sa.DateTime(timezone=True)),
)

approval_decisions = sa.Table(
    "approval_decisions",
    metadata,
    sa.Column("refund_id", sa.String(200), primary_key=True),  # one decision per refund: first wins
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("approver", sa.String(200), nullable=False),
    sa.Column("amount_minor", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("note", sa.Text, nullable=False, server_default=""),
    sa.Column("via", sa.String(200), nullable=False, server_default=""),  # the channel (migration 0009)
)

# API clients (migration 0009): who calls the HTTP API. The key is shown once and kept only as its SHA-256.
api_clients = sa.Table(
    "api_clients",
    metadata,
    sa.Column("client_id", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(100), nullable=False, unique=True),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("scopes", sa.String(200), nullable=False),  # space-separated
    sa.Column("operator", sa.String(100)),  # the console operator this client acts for, if any
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("last_used_at", sa.DateTime(timezone=True)),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
)

# Console sign-ins (migration 0010). The cookie carries a random session id; only its SHA-256 is kept, with
# a fingerprint of the operator's credentials at sign-in (a changed role or password ends the session).
console_sessions = sa.Table(
    "console_sessions",
    metadata,
    sa.Column("session_hash", sa.String(64), primary_key=True),
    sa.Column("operator", sa.String(100), nullable=False, index=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("credentials", sa.String(64), nullable=False),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),  # the absolute end; idleness ends it sooner
    sa.Column("address", sa.String(64), nullable=False),
    sa.Column("user_agent", sa.String(300), nullable=False, server_default=""),
)

# Failed console sign-ins, shared by every API process: per name (keyed by an HMAC of what was typed, which
# may be a mistyped password) a growing delay, and per client address a count in a fixed window.
console_sign_in_throttle = sa.Table(
    "console_sign_in_throttle",
    metadata,
    sa.Column("throttle_key", sa.String(100), primary_key=True),  # name:<hmac> or address:<ip>
    sa.Column("failures", sa.Integer, nullable=False),
    sa.Column("window_started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("retry_at", sa.DateTime(timezone=True)),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, index=True),
)

audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("refund_id", sa.String(200), nullable=False, index=True),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False, unique=True),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("message_key", sa.String(300), nullable=False, unique=True),
    sa.Column("refund_id", sa.String(200), nullable=False, index=True),
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("recipient", sa.String(320), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # Its delivery (migration 0014, steps/mail.py): pending | sending (claimed) | sent | failed. A claim holds the
    # worker's executor id, a token and a lease end; times in ms are the database's clock.
    sa.Column("delivery_state", sa.String(16), nullable=False, server_default="pending"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_ms", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("claimed_by", sa.String(200)),
    sa.Column("claim_token", sa.String(64)),
    sa.Column("claim_until_ms", sa.BigInteger),
    sa.Column("last_error", sa.String(500)),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
    sa.Index("ix_outbox_delivery_state_next_attempt_ms", "delivery_state", "next_attempt_ms"),
)


slack_deliveries = sa.Table(
    "slack_deliveries",
    metadata,
    sa.Column("signature", sa.String(128), primary_key=True),  # each signed request is processed once
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

# What the payment provider told us about a refund and what came of it (migration 0011): each verified webhook
# event, and each re-read that settled a refund or was refused, once. /metrics counts them cluster-wide.
provider_events = sa.Table(
    "provider_events",
    metadata,
    sa.Column("event_key", sa.String(300), primary_key=True),  # Stripe's event id, or the re-read's workflow id
    sa.Column("source", sa.String(16), nullable=False),  # webhook | recheck
    sa.Column("event_type", sa.String(64), nullable=False),  # refund.updated, refund.failed, ... (recheck: recheck)
    sa.Column("refund_id", sa.String(200)),  # ours, when the event named a refund we hold
    sa.Column("provider_refund_id", sa.String(64)),  # the provider refund it named (well-formed ids only)
    sa.Column("outcome", sa.String(16), nullable=False),  # accepted | ignored | rejected
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_provider_events_refund_id", "refund_id"),
)


# The help desk (migration 0015, agent/http/helpdesk.py): each signed webhook delivery once, by its signature; the
# ticket a refund came from (its replies are posted back there); and the customers' comments on such tickets, kept as
# plain text for whatever reads the conversation later (never rendered unescaped).
helpdesk_deliveries = sa.Table(
    "helpdesk_deliveries",
    metadata,
    sa.Column("signature", sa.String(128), primary_key=True),  # base64 HMAC of timestamp + body: one per delivery
    sa.Column("event_type", sa.String(100), nullable=False),
    sa.Column("ticket_id", sa.String(32)),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
)

helpdesk_tickets = sa.Table(
    "helpdesk_tickets",
    metadata,
    sa.Column("ticket_id", sa.String(32), primary_key=True),
    sa.Column("refund_id", sa.String(200), nullable=False, unique=True),
    sa.Column("requested_by", sa.String(200), nullable=False),  # the help desk's principal, from the channel
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

helpdesk_comments = sa.Table(
    "helpdesk_comments",
    metadata,
    sa.Column("comment_id", sa.String(32), primary_key=True),  # the help desk's comment id: recorded once
    sa.Column("ticket_id", sa.String(32), nullable=False, index=True),
    sa.Column("refund_id", sa.String(200), nullable=False, index=True),
    sa.Column("author_role", sa.String(16), nullable=False),  # end-user (the customer)
    sa.Column("body", sa.Text, nullable=False),  # as the help desk sent it: plain text, never HTML
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),  # when the help desk says it was written
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
)


# A refund's question to its customer (migration 0016, steps/questions.py): one per refund, so nothing is asked twice.
# ``state`` moves once, from open to answered (the answer recorded with it) or expired, guarded by its own update.
customer_questions = sa.Table(
    "customer_questions",
    metadata,
    sa.Column("refund_id", sa.String(200), primary_key=True),
    sa.Column("question", sa.String(32), nullable=False),  # delivery | photo | return_tracking
    sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("remind_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("reminded_at", sa.DateTime(timezone=True)),
    sa.Column("state", sa.String(16), nullable=False),  # open | answered | expired
    sa.Column("case_file", sa.JSON, nullable=False),  # the request and the proposal judged again with the answer
    sa.Column("answered_at", sa.DateTime(timezone=True)),
    sa.Column("answer", sa.JSON),  # steps.evidence.CustomerAnswer, plain text and file descriptions
    sa.Column("answer_key", sa.String(300)),  # what delivered it (a help-desk comment, a link's form): once
)

# Files customers uploaded with an answer through its link: kept as bytes with their type, size and SHA-256, and
# never served back (nothing renders or runs them).
customer_answer_files = sa.Table(
    "customer_answer_files",
    metadata,
    sa.Column("refund_id", sa.String(200), primary_key=True),
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("content_type", sa.String(100), nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("content", sa.LargeBinary, nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
)


def insert_if_absent(conn: sa.Connection | Session, table: sa.Table, values: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; True when this call inserted the row."""
    dialect = conn.dialect if isinstance(conn, sa.Connection) else conn.get_bind().dialect
    insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
    key = next(iter(table.primary_key.columns))
    inserted = conn.execute(insert(table).values(**values).on_conflict_do_nothing().returning(key)).first()
    return inserted is not None


def utc(value: datetime) -> datetime:
    """SQLite hands timestamps back naive; everything here is stored in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs (the driver DBOS itself uses)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def transient_database_error(error: BaseException) -> str | None:
    """The name of the database error behind ``error`` if retrying the request can succeed, else None.

    Lost or refused connections, a restarting server, deadlocks, serialization failures, timeouts, an
    exhausted pool, a busy SQLite file: the database did nothing wrong with the request, it just could
    not finish it now.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlalchemy.exc.TimeoutError):  # no pooled connection free in time
            return type(current).__name__
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return type(current.orig).__name__
        if isinstance(current, psycopg.OperationalError):  # connection, shutdown, deadlock, serialization, timeouts
            return type(current).__name__
        if isinstance(current, sqlite3.OperationalError) and ("locked" in str(current) or "busy" in str(current)):
            return type(current).__name__
        current = current.__cause__ or current.__context__  # SQLAlchemy raises its errors from the driver's
    return None


SQLITE_BUSY_TIMEOUT_S = 30.0


def _wal(dbapi_conn: Any) -> None:
    """Put the file in WAL mode (it stays so). Switching a file that another process is writing, as when
    two processes start at once on a new file and one migrates it, fails at once with "database is
    locked": SQLite does not wait on its busy timeout for that lock. So wait here, as long as it would."""
    if str(dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An engine with the settings DBOS expects; SQLite also gets WAL and synchronous=NORMAL."""
    url = normalize_url(url)
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=False, **kwargs)
    engine = sa.create_engine(url, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Mirrors DBOS's own SQLite set-up, which a custom engine bypasses.
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        _wal(dbapi_conn)
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


@dataclass
class AppDatabase:
    url: str
    engine: sa.Engine
    datasource: SQLAlchemyDatasource | None


_current: AppDatabase | None = None


def open_app_database(url: str, *, durable: bool = False) -> AppDatabase:
    """Connect the application database; ``durable`` also creates the DBOS datasource that steps
    write through (only processes that run workflows need it, and only before ``DBOS.launch()``)."""
    global _current
    engine = create_engine(url)
    datasource = SQLAlchemyDatasource.create(normalize_url(url), engine=engine) if durable else None
    _current = AppDatabase(url, engine, datasource)
    return _current


def close_app_database() -> None:
    global _current
    if _current is not None:
        _current.engine.dispose()
    _current = None


def app_db() -> AppDatabase:
    if _current is None:
        raise RuntimeError("the application database is not open; call runtime.start() first")
    return _current


def _datasource() -> SQLAlchemyDatasource:
    datasource = app_db().datasource
    if datasource is None:
        raise RuntimeError("this process opened the application database without a DBOS datasource")
    return datasource


_plain_session: ContextVar[Session | None] = ContextVar("plain_session", default=None)


def session() -> Session:
    """The session of the transaction in progress (a DBOS datasource transaction, or a plain one)."""
    plain = _plain_session.get()
    return plain if plain is not None else _datasource().sql_session()


@contextmanager
def _plain_transaction() -> Iterator[None]:
    with Session(app_db().engine) as sess, sess.begin():
        token = _plain_session.set(sess)
        try:
            yield
        finally:
            _plain_session.reset(token)


class _TxOptions(TypedDict, total=False):
    """The options ``SQLAlchemyDatasource.run_tx_step`` takes (DBOS's own type is not exported)."""

    name: str | None
    isolation_level: Literal["SERIALIZABLE", "READ COMMITTED"] | None


def transaction(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A DBOS datasource transaction: the write and its checkpoint commit together, exactly once.

    A process that opened the application database without a datasource (the eval harness: no DBOS,
    no workflow) runs the same function as a plain transaction, which is what a datasource transaction
    is outside a workflow anyway.
    """

    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        @wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            datasource = app_db().datasource
            if datasource is None:
                with _plain_transaction():
                    return func(*args, **kwargs)
            # Postgres: READ COMMITTED, with explicit locks where order matters (the audit chain) and
            # atomic updates elsewhere; a SERIALIZABLE snapshot taken before the audit lock would read a
            # stale chain head. SQLite serializes writers with IMMEDIATE transactions anyway.
            options: _TxOptions = {
                "name": name,
                "isolation_level": "SERIALIZABLE" if app_db().url.startswith("sqlite") else "READ COMMITTED",
            }
            return datasource.run_tx_step(options, func, *args, **kwargs)  # type: ignore[arg-type]

        return wrapper

    return decorator


#: A read step's retries of a database that is briefly away (a restart, a failover, a busy file): DBOS waits
#: 0.1 s, then doubles the wait, between attempts (about 51 s over all ten).
READ_ATTEMPTS = 10


def read_step(name: str) -> Callable[[Callable[Concatenate[sa.Connection, P], R]], Callable[P, R]]:
    """A read of the application database as a DBOS step, checkpointed once, in the system database.

    A datasource transaction would also write a checkpoint row into the application database, turning
    a read into a committed write, and check ownership on both databases; a read has nothing to
    commit exactly once (run again after a crash, it only reads again), so it skips all that.
    Datasource transactions retry a lost connection themselves; DBOS retries a read's transient database
    errors (and nothing else), so a database restart delays the refund instead of failing its agent turn.
    """

    def transient(error: BaseException) -> bool:
        found = transient_database_error(error)
        if found is not None:
            log.warning("%s: database unavailable (%s); retrying", name, found)
        return found is not None

    def decorator(func: Callable[Concatenate[sa.Connection, P], R]) -> Callable[P, R]:
        @wraps(func)
        def read(*args: P.args, **kwargs: P.kwargs) -> R:
            with app_db().engine.connect() as conn:
                return func(conn, *args, **kwargs)

        return DBOS.step(
            name=name,
            retries_allowed=True,
            should_retry=transient,
            max_attempts=READ_ATTEMPTS,
            interval_seconds=0.1,
            backoff_rate=2.0,
        )(read)

    return decorator


def db_now_ms(conn: sa.Connection) -> int:
    """The database's clock in epoch milliseconds: the one clock every host shares (leases, delivery claims)."""
    if conn.dialect.name == "sqlite":
        expr = sa.text("SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)")
    else:
        expr = sa.text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
    return int(conn.execute(expr).scalar_one())
