"""Two refunds of one order running at once on two workers.

One order has one open claim: the later of two claims reads the earlier one in its case file and waits for a
person with it, and two claims that reach the reservation at once are settled under the order's lock
(tests/test_open_claims.py). Behind that, policy checks each refund against the order right before paying
(``refunds.record_verdict_and_reserve``, or ``refunds.prepare_approved_payment`` once approved), and the
order's refunded amount only grows after the provider answered (``refunds.record_payment``), so the amount
being paid is reserved in between. Without either both workers pass the check and a 42.00 order is refunded
42.00 twice; one process alone does not show it (its sync payment step holds the event loop), two do.
"""

from __future__ import annotations

import subprocess
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent import runtime
from agent.domain import RefundRequest
from agent.ops.processes import spawn, stop, wait_for
from agent.submit import submit_refund
from steps import audit
from steps.refunds import register_request
from steps.reservations import record_verdict_and_reserve_step
from steps.store import app_db, orders
from tests.conftest import Env
from tests.identities import HELPDESK
from tests.test_money_properties import Service


def test_two_workers_never_refund_one_order_beyond_what_was_captured(tmp_path: Path) -> None:
    svc = Service(tmp_path)
    svc.sandbox.set_faults(latency_ms=2000)  # a slow provider: both refunds are in flight at once
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("w1", "w2"):
            env = {**svc.vars, "REFUND_AGENT_EXECUTOR_ID": name, "QUEUE_WORKER_CONCURRENCY": "1"}
            workers.append(spawn(["worker"], env=env, log=tmp_path / f"{name}.log"))

        def ready() -> bool:
            logs = [tmp_path / f"{name}.log" for name in ("w1", "w2")]
            return all(log.exists() and "running refunds" in log.read_text() for log in logs)

        wait_for(ready, timeout=60, what="both workers")
        keys = ["twice-0001-ord", "twice-0002-ord"]
        for key in keys:
            request = RefundRequest(order_id="ord_1001", message="The mouse is broken; refund it.")
            submit_refund(svc.client, idempotency_key=key, requester=HELPDESK, request=request, app_version="0.1.0")
        outcomes: list[str] = sorted(
            svc.client.retrieve_workflow(key).get_result(polling_interval_sec=0.2)["status"] for key in keys
        )
        paid = [int(r["amount"]) for r in svc.sandbox.refunds("ch_ord_1001")]
        assert paid == [4200]  # ord_1001 captured 42.00 USD: paid once, in full
        assert outcomes == ["awaiting_approval", "completed"]  # the second claim waits for a person
    finally:
        for worker in workers:
            stop(worker)
        svc.close()


@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_booking_a_payment_while_another_refund_of_the_order_reserves_does_not_deadlock(
    env: Env, service: runtime.Runtime
) -> None:
    """``refunds.record_payment`` locks the order's row, then appends to the audit chain. An auto-approved
    refund of the same order recording its verdict and reservation at that moment must queue behind it,
    not take the chain's lock and then wait for the row (Postgres would abort one of them)."""
    register_request(
        refund_id="lock-order-0001",
        order_id="ord_1001",
        request_hash="h",
        currency="USD",
        requested=Decimal("1.00"),
        requester=HELPDESK,
    )
    payer = app_db().engine.connect()
    booking = payer.begin()
    # What record_payment does for another refund of ord_1001: the order's row first ...
    payer.execute(orders.update().where(orders.c.order_id == "ord_1001").values(amount_refunded_minor=0))
    done: dict[str, Any] = {}

    def reserve() -> None:
        try:
            done["plan"] = record_verdict_and_reserve_step(
                "lock-order-0001",
                "ord_1001",
                proposal={"amount": "1.00", "currency": "USD", "reason": "broken", "customer_reply": "Refunded."},
                verdict={"kind": "auto_approve", "amount": "1.00", "currency": "USD"},
                model="offline model",
                amount=Decimal("1.00"),
                currency="USD",
            )
        except Exception as error:
            done["error"] = error

    def waiting_for_the_row() -> bool:
        with app_db().engine.connect() as conn:  # its own transaction: statistics views are fixed within one
            waits = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE 'SELECT orders.%FOR UPDATE%'"
                )
            ).scalar_one()
        return bool(waits)

    reserving = threading.Thread(target=reserve)
    reserving.start()
    try:
        wait_for(waiting_for_the_row, timeout=30, what="the reservation to wait for the order's row")
        # ... then the audit chain, while the reservation waits. Should the two wait for each other, this side
        # runs Postgres's deadlock check first and is aborted (the step's own retry would hide the deadlock).
        payer.execute(sa.text("SET LOCAL deadlock_timeout = '10ms'"))
        payer.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
        payer.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": audit.AUDIT_CHAIN_LOCK})
        booking.commit()
    finally:
        if booking.is_active:
            booking.rollback()
        payer.close()
        reserving.join(30)
    assert "error" not in done, done.get("error")
    plan = done["plan"]
    assert plan.snapshot is not None and plan.snapshot.order.order_id == "ord_1001"
    with app_db().engine.connect() as conn:
        assert audit.verify(conn).ok
