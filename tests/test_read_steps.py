"""Reads of the application database inside a refund ride over a database that is briefly away.

A refund's agent turn reads the order and the customer's history through read steps. Writes go
through DBOS datasource transactions, which retry a lost connection themselves; a read that failed
on one instead ended the agent turn, and the refund was recorded ``failed`` by a Postgres restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from steps import store
from steps.migrate import upgrade
from steps.orders import load_order_step
from steps.seed import seed
from tests.conftest import Env


@pytest.fixture
def app_database(env: Env) -> Iterator[store.AppDatabase]:
    upgrade(env.dbs.app_url)
    opened = store.open_app_database(env.dbs.app_url)
    seed(opened.engine)
    try:
        yield opened
    finally:
        store.close_app_database()


def test_a_read_step_reads_again_after_its_connections_were_cut(
    env: Env, app_database: store.AppDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    if env.backend != "postgres":
        pytest.skip("cuts Postgres sessions")
    assert load_order_step("ord_1001") is not None  # the pool now holds a live connection
    assert env.cut_app_database_sessions() > 0
    snapshot = load_order_step("ord_1001")
    assert snapshot is not None and snapshot.order.order_id == "ord_1001"
    assert "orders.load_order: database unavailable" in caplog.text  # it met the cut connection


def test_a_read_step_does_not_retry_what_a_retry_cannot_fix(
    app_database: store.AppDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with app_database.engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE orders RENAME TO orders_gone"))
    with pytest.raises(sa.exc.DBAPIError, match="orders"):
        load_order_step("ord_1001")
    assert "retrying" not in caplog.text
