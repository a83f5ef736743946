"""A decision ends the waiting: once a refund is approved, rejected, expired or settled by the provider's webhook,
none of its workflows is DELAYED, ENQUEUED or PENDING, long before its timers would have come due."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dbos import DBOSClient

from agent import approvals, runtime
from agent.approval_workflows import decide_here
from agent.http.server import create_app
from agent.ops.processes import wait_for
from steps.seed import seed
from steps.store import app_db
from tests import web
from tests.conftest import API_KEY, Env
from tests.identities import DANA
from tests.servers import ThreadedServer, bound_socket
from tests.test_refund_lifecycle import API_TOKEN, WEBHOOK_SECRET, row, settle_at_sandbox, until
from tests.test_workflow import parked, result, running, submit

WAITING = ("DELAYED", "ENQUEUED", "PENDING")
HOUR = 3600.0  # every timer in these tests is due an hour or more away: only the decision can end it


def still_waiting(client: DBOSClient, refund_id: str) -> list[str]:
    """The refund's workflows (ids starting with its id) that wait, are queued or run."""
    found = client.list_workflows(workflow_id_prefix=refund_id, load_input=False, load_output=False)
    return [f"{wf.workflow_id} {wf.status}" for wf in found if wf.status in WAITING]


def nothing_waits(client: DBOSClient, refund_id: str) -> None:
    wait_for(lambda: not still_waiting(client, refund_id), timeout=30, what=f"every workflow of {refund_id} to end")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_ends_the_deadline_and_the_reminder(env: Env, decision: str) -> None:
    with running(env, approval_escalate_after_seconds=HOUR, approval_timeout_seconds=2 * HOUR) as client:
        refund_id = submit(client, f"ends-{decision}-0001", "ord_1002")
        parked(client, refund_id)
        assert sorted(still_waiting(client, refund_id)) == [
            f"{refund_id}/deadline DELAYED",
            f"{refund_id}/escalate DELAYED",
        ]
        approvals.decide_pending(decide_here, refund_id=refund_id, decision=decision, approver=DANA, via="console")  # type: ignore[arg-type]
        assert result(client, refund_id)["status"] == ("completed" if decision == "approve" else "rejected")
        nothing_waits(client, refund_id)
        ran = {wf.workflow_id: wf for wf in client.list_workflows(workflow_id_prefix=refund_id, load_input=False)}
        # The timers ran, found the decision and ended: no reminder, no second outcome.
        assert ran[f"{refund_id}/escalate"].status == "SUCCESS" and ran[f"{refund_id}/escalate"].output is False
        assert ran[f"{refund_id}/deadline"].status == "SUCCESS" and ran[f"{refund_id}/deadline"].output is None


def test_an_expiry_ends_the_reminder_still_waiting(env: Env) -> None:
    with running(env, approval_escalate_after_seconds=3.9, approval_timeout_seconds=4.0) as client:
        refund_id = submit(client, "ends-expired-0001", "ord_1009")
        parked(client, refund_id)
        # The reminder is due after the deadline (as when a deadline is moved earlier by hand): it still waits
        # when the refund expires, and the expiry ends it.
        client.set_workflow_delay(f"{refund_id}/escalate", delay_seconds=2 * HOUR)
        assert result(client, refund_id)["status"] == "rejected"
        nothing_waits(client, refund_id)
        [reminder] = client.list_workflows(workflow_ids=[f"{refund_id}/escalate"], load_input=False)
        assert (reminder.status, reminder.output) == ("SUCCESS", False)  # it ran, found the expiry, sent nothing


@pytest.fixture
def served(env: Env) -> Iterator[DBOSClient]:
    """The service over HTTP with a webhook secret; the provider's next re-read an hour away."""
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    settings = env.settings(
        refund_agent_port=port,
        refund_agent_api_token=API_TOKEN,
        stripe_webhook_secret=WEBHOOK_SECRET,
        payment_recheck_seconds=HOUR,
    )
    server = ThreadedServer(create_app(settings, freeze_heap=False), sock=sock)
    server.start()
    seed(app_db().engine)
    client = runtime.client(settings)
    with web.client(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        target = {"url": f"{server.base_url}/webhooks/stripe", "secret": WEBHOOK_SECRET}
        http.put(f"{env.sandbox.base_url}/_sandbox/webhook", json=target).raise_for_status()
    try:
        yield client
    finally:
        client.destroy()
        server.stop()


def test_a_webhook_settlement_ends_the_waiting_re_read(env: Env, served: DBOSClient) -> None:
    client = served
    env.sandbox.set_faults(pending_next=1, settle_after_ms=-1)  # pending until settled by hand
    refund_id = submit(client, "ends-webhook-0001", "ord_1001")
    until(client, refund_id, "settling")
    only_the_check = [f"{refund_id}/payment-check-1 DELAYED"]  # once the paying run has ended
    wait_for(lambda: still_waiting(client, refund_id) == only_the_check, timeout=30, what="the refund to wait")
    settle_at_sandbox(env, row(refund_id).provider_refund_id, "succeeded")
    until(client, refund_id, "completed", timeout=30)
    nothing_waits(client, refund_id)
    check = client.list_workflows(workflow_ids=[f"{refund_id}/payment-check-1"], load_input=False)
    assert [wf.status for wf in check] == ["SUCCESS"]  # it re-read the row, found it settled, and ended
