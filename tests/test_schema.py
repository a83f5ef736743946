"""The application schema: migrations match the code's tables, and hot reads stay bounded as refunds pile up."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from steps.migrate import upgrade
from steps.orders import HISTORY_LIMIT, refund_history_query, walk_indexes_in_order
from steps.seed import seed
from steps.store import create_engine, metadata, refunds
from tests.conftest import Env

ORDERS = ["ord_1001", "ord_1003"]  # cus_ada's two demo orders


@pytest.fixture
def app_engine(env: Env) -> Iterator[sa.Engine]:
    upgrade(env.dbs.app_url)
    engine = create_engine(env.dbs.app_url)
    seed(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_migrations_at_head_create_exactly_the_tables_and_indexes_the_code_declares(app_engine: sa.Engine) -> None:
    with app_engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    assert differences == []


def _add_refunds(engine: sa.Engine, count: int, start: int) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {
            "refund_id": f"hist-{i}",
            "order_id": ORDERS[i % len(ORDERS)],
            "request_hash": "h",
            "currency": "USD",
            "requested_amount_minor": 100 + i,
            "status": "awaiting_approval",
            "reason": "r" * 400,  # as wide as real rows: the planner's guesses depend on the table's size
            "customer_reply": "c" * 400,
            "created_at": t0 + timedelta(seconds=i),
            "updated_at": t0,
        }
        for i in range(start, start + count)
    ]
    with engine.begin() as conn:  # no ANALYZE: the plan must not depend on statistics being fresh
        conn.execute(refunds.insert(), rows)


def _history(conn: sa.Connection) -> list[str]:
    return [row.refund_id for row in conn.execute(refund_history_query("cus_ada", conn.dialect.name))]


def _refund_rows_read(conn: sa.Connection) -> int:
    """Rows of ``refunds`` the history query reads: Postgres's own count from EXPLAIN ANALYZE."""
    query = refund_history_query("cus_ada", "postgresql")
    sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
    walk_indexes_in_order(conn)  # as the step does, in the same transaction
    plan = conn.execute(sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")).scalar_one()
    conn.rollback()
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def walk(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] * node["Actual Loops"] if node.get("Relation Name") == "refunds" else 0
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan[0]["Plan"])


def _sqlite_steps(conn: sa.Connection) -> int:
    """Virtual-machine instructions SQLite runs for the history query (one progress callback per step)."""
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    raw.set_progress_handler(tick, 1)
    try:
        _history(conn)
    finally:
        raw.set_progress_handler(None, 0)
    return steps


def _work(conn: sa.Connection) -> int:
    return _refund_rows_read(conn) if conn.dialect.name == "postgresql" else _sqlite_steps(conn)


def test_refund_history_is_the_newest_refunds_and_its_cost_does_not_grow_with_the_customers_refunds(
    app_engine: sa.Engine,
) -> None:
    _add_refunds(app_engine, 100, start=0)
    with app_engine.connect() as conn:
        work_small = _work(conn)
    _add_refunds(app_engine, 1900, start=100)
    with app_engine.connect() as conn:
        newest = [f"hist-{i}" for i in range(1999, 1999 - HISTORY_LIMIT, -1)]
        assert _history(conn) == newest
        work_large = _work(conn)
    if app_engine.dialect.name == "postgresql":  # at most the limit from each of the customer's orders
        assert work_large <= HISTORY_LIMIT * len(ORDERS)
    # 20x the refunds: a join and sort over all of them would do ~20x the work; the walk does about the same.
    assert work_large < 2 * work_small


def test_a_new_sqlite_file_opens_while_another_process_is_migrating_it(tmp_path: Path) -> None:
    """Two processes starting at once on a new file: one creates tables while the other connects and
    switches the file to WAL. SQLite answers that switch "database is locked" at once, without its busy
    timeout; the engine waits for the writer instead of failing the second process's start."""
    path = tmp_path / "new.sqlite"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE migrated (x INTEGER)")
    done = threading.Timer(0.5, lambda: writer.execute("COMMIT"))
    done.start()
    try:
        with create_engine(f"sqlite:///{path}").connect() as conn:
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(sa.text("SELECT count(*) FROM migrated")).scalar() == 0
    finally:
        done.join()
        writer.close()
