"""A refund parked for approval is rows in the database: no running workflow, no queue slot, no coroutine.

Its deciding workflow has ended; what waits is its approval request (application database) and two
DELAYED workflows, the deadline and the reminder (system database), which no worker loads until they
are due. So a worker with one queue slot keeps starting refunds whatever waits, and a restart finds
nothing to recover.
"""

from __future__ import annotations

import gc
from datetime import datetime
from typing import Any

import pytest
from dbos import DBOSClient

from agent import approvals, runtime
from agent.approvals import deadline_id, escalation_id, family
from agent.domain import RefundRequest
from agent.ops.processes import wait_for
from agent.status import parked, wait_for_outcome
from agent.submit import submit_refund
from steps.seed import seed
from steps.store import app_db
from tests.conftest import Env
from tests.identities import DANA, HELPDESK


def _parked(client: DBOSClient, refund_id: str) -> dict[str, Any]:
    return wait_for(lambda: parked(client, refund_id), timeout=60, what="the refund to park")


def _statuses(client: DBOSClient, refund_id: str) -> dict[str, Any]:
    return {w.workflow_id: w for w in client.list_workflows(workflow_ids=family(refund_id), load_input=False)}


def test_parked_refunds_leave_no_running_workflow_and_the_next_refund_runs(env: Env) -> None:
    rt = runtime.start(
        env.settings(queue_worker_concurrency=1, approval_escalate_after_seconds=3600.0), freeze_heap=False
    )
    seed(app_db().engine)
    client: DBOSClient = runtime.client(rt.settings)
    try:
        waiting = [f"holds-nothing-{n}" for n in range(3)]
        for refund_id in waiting:
            request = RefundRequest(order_id="ord_1002", message="Everything arrived broken.")
            submit_refund(client, idempotency_key=refund_id, requester=HELPDESK, request=request)
        for refund_id in waiting:
            pending = _parked(client, refund_id)
            runs = _statuses(client, refund_id)
            assert runs[refund_id].status == "SUCCESS"  # the deciding workflow ended
            deadline, reminder = runs[deadline_id(refund_id)], runs[escalation_id(refund_id)]
            assert (deadline.status, reminder.status) == ("DELAYED", "DELAYED")
            assert deadline.app_version is None  # runs on whatever release is deployed when it is due
            due = deadline.delay_until_epoch_ms / 1000
            assert abs(due - datetime.fromisoformat(pending["expires_at"]).timestamp()) < 5
            assert set(runs) == {refund_id, deadline_id(refund_id), escalation_id(refund_id)}
        assert client.list_workflows(status=["PENDING", "ENQUEUED"], load_input=False) == []

        # One queue slot, three refunds waiting: the next refund still starts at once and completes.
        small = RefundRequest(order_id="ord_1001", message="The mouse is broken.")
        submit_refund(client, idempotency_key="holds-nothing-small", requester=HELPDESK, request=small)
        assert wait_for_outcome(client, "holds-nothing-small", timeout=60)["status"] == "completed"
    finally:
        client.destroy()
        runtime.stop()


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_start_up_objects_stay_out_of_full_collections_until_the_runtime_stops(env: Env) -> None:
    assert gc.get_freeze_count() == 0
    runtime.start(env.settings())
    try:
        assert gc.get_freeze_count() > 10_000  # modules, validators, the agent, DBOS's registry
    finally:
        runtime.stop()
    assert gc.get_freeze_count() == 0  # a stopped runtime's objects are ordinary garbage again


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_metrics_count_parked_escalated_and_overdue_approvals(env: Env) -> None:
    from prometheus_client import generate_latest

    from agent.http import metrics
    from steps.store import approval_requests
    from tests.test_scale import metric

    rt = runtime.start(
        env.settings(approval_escalate_after_seconds=0.5, approval_timeout_seconds=3600.0), freeze_heap=False
    )
    seed(app_db().engine)
    client: DBOSClient = runtime.client(rt.settings)
    registry = metrics.api_registry(app_db().engine, client, runtime.QUEUES)
    try:
        for refund_id in ("observed-0", "observed-1"):
            request = RefundRequest(order_id="ord_1002", message="Everything arrived broken.")
            submit_refund(client, idempotency_key=refund_id, requester=HELPDESK, request=request)
            _parked(client, refund_id)

        def scraped() -> str:
            return generate_latest(registry).decode()

        wait_for(
            lambda: metric(scraped(), "refund_agent_parked_approvals_escalated") == 2, timeout=60, what="reminders"
        )
        assert metric(scraped(), "refund_agent_parked_approvals") == 2
        assert metric(scraped(), "refund_agent_approval_deadlines_overdue") == 0
        with app_db().engine.begin() as conn:  # as if the deadline workflow lagged behind its deadline
            conn.execute(
                approval_requests.update()
                .where(approval_requests.c.refund_id == "observed-0")
                .values(expires_at=datetime(2020, 1, 1))
            )
        assert metric(scraped(), "refund_agent_approval_deadlines_overdue") == 1
        assert metric(scraped(), 'refund_agent_queue_depth{queue="approvals",status="PENDING"}') == 0
    finally:
        client.destroy()
        runtime.stop()


def test_a_decision_and_its_payment_go_before_deadlines_that_are_already_due(env: Env) -> None:
    """Deadlines are enqueued when their refunds park, long before any decision; the approvals queue still
    serves a decision and its continuation first (DBOS dequeues by priority, then age)."""
    one = {"approval_queue_worker_concurrency": 1}  # stored with the queue; a worker's first poll reads it
    settings = env.settings(approval_timeout_seconds=3600.0, approval_escalate_after_seconds=3600.0, **one)
    rt = runtime.start(settings, freeze_heap=False)
    seed(app_db().engine)
    client: DBOSClient = runtime.client(rt.settings)
    try:
        request = RefundRequest(order_id="ord_1002", message="Everything arrived broken.")
        submit_refund(client, idempotency_key="priority-approved", requester=HELPDESK, request=request)
        _parked(client, "priority-approved")
        runtime.stop()
        # Six refunds whose deadlines fall due while no worker runs.
        runtime.start(
            env.settings(approval_timeout_seconds=6.0, approval_escalate_after_seconds=6.0, **one), freeze_heap=False
        )
        expiring = [f"priority-expiring-{i}" for i in range(6)]
        for refund_id in expiring:
            submit_refund(client, idempotency_key=refund_id, requester=HELPDESK, request=request)
        for refund_id in expiring:
            _parked(client, refund_id)
        runtime.stop()
        # A process that runs no queue moves the due deadlines to the queue; the decision is enqueued too.
        runtime.start(env.settings(**one), worker=False, freeze_heap=False)
        deadlines = [deadline_id(r) for r in expiring]

        def all_due() -> bool:
            found = client.list_workflows(workflow_ids=deadlines, load_input=False)
            return [w.status for w in found] == ["ENQUEUED"] * len(deadlines)

        wait_for(all_due, timeout=60, what="the deadlines to fall due")
        decider = approvals.decider_via_queue(client, timeout=0)
        with pytest.raises(approvals.ApprovalError, match="waits for a worker"):
            approvals.decide_pending(
                decider, refund_id="priority-approved", decision="approve", approver=DANA, via="console"
            )
        runtime.stop()

        runtime.start(env.settings(**one), freeze_heap=False)  # one at a time, in queue order
        assert wait_for_outcome(client, "priority-approved", timeout=60)["status"] == "completed"
        for refund_id in expiring:
            assert wait_for_outcome(client, refund_id, timeout=60)["status"] == "rejected"

        def began(workflow_id: str) -> int:  # its first step's start (ms on both backends)
            return min(step["started_at_epoch_ms"] or 0 for step in client.list_workflow_steps(workflow_id))

        first_deadline = min(began(d) for d in deadlines)
        assert began("priority-approved/decision") < began("priority-approved/settle") < first_deadline
    finally:
        client.destroy()
        runtime.stop()
