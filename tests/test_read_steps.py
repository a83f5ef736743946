"""Reads of the application database inside a refund ride over a database that is briefly away.

A refund's agent turn reads the order and the customer's history through read steps. Writes go
through DBOS datasource transactions, which retry a lost connection themselves; a read that failed
on one instead ended the agent turn, and the refund was recorded ``failed`` by a Postgres restart.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from dbos import DBOS

from agent import runtime
from steps import store
from steps.orders import load_order_step
from tests.conftest import Env

#: Durable name of the test-only workflow that reads an order as the refund workflow does.
READ_WORKFLOW = "tests.read_an_order"


@DBOS.workflow(name=READ_WORKFLOW)
def read_in_a_workflow(order_id: str) -> str | None:
    snapshot = load_order_step(order_id)
    return snapshot.order.order_id if snapshot is not None else None


def test_a_read_step_reads_again_after_its_connections_were_cut(
    env: Env, service: runtime.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    if env.backend != "postgres":
        pytest.skip("cuts Postgres sessions")
    # The executor lease's renewal shares the pool and may meet a cut connection first, healing the pool
    # before the read does; cut and read again until a read is the one that meets it.
    for _ in range(10):
        assert read_in_a_workflow("ord_1001") == "ord_1001"  # the pool now holds a live connection
        assert env.cut_app_database_sessions() > 0
        assert read_in_a_workflow("ord_1001") == "ord_1001"
        if "orders.load_order: database unavailable" in caplog.text:
            break
    assert "orders.load_order: database unavailable" in caplog.text  # it met the cut connection


def test_a_read_step_does_not_retry_what_a_retry_cannot_fix(
    service: runtime.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    with store.app_db().engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE orders RENAME TO orders_gone"))
    with pytest.raises(sa.exc.DBAPIError, match="orders"):
        read_in_a_workflow("ord_1001")
    assert "retrying" not in caplog.text
