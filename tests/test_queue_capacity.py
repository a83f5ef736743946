"""A refund parked for approval must not keep other refunds from running (found by the chaos soak).

Today a parked workflow stays PENDING on the worker that dequeued it, and DBOS counts it against the
queue's ``worker_concurrency`` for as long as it waits (up to APPROVAL_TIMEOUT_SECONDS, 72 h by
default). With the default of 4, four unanswered approvals on a worker stop it from starting any other
refund. Marked strict xfail: it turns into a failure (XPASS) the day the wait stops holding a slot.
"""

from __future__ import annotations

from typing import Any

import pytest
from dbos import DBOSClient

from agent import approvals, runtime
from agent.domain import RefundRequest
from agent.processes import wait_for
from agent.submit import submit_refund
from steps.seed import seed
from steps.store import app_db
from tests.conftest import Env


@pytest.mark.xfail(strict=True, reason="a parked approval holds one of the worker's queue slots while it waits")
@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_a_refund_waiting_for_approval_does_not_block_the_next_refund(env: Env) -> None:
    rt = runtime.start(env.settings(queue_worker_concurrency=1))
    seed(app_db().engine)
    client: DBOSClient = runtime.client(rt.settings)
    try:
        big = RefundRequest(order_id="ord_1002", message="Everything arrived broken.")
        submit_refund(client, idempotency_key="slot-big-00001", request=big, app_version="0.1.0")
        wait_for(lambda: approvals.pending_request(client, "slot-big-00001"), timeout=60, what="the approval request")
        small = RefundRequest(order_id="ord_1001", message="The mouse is broken.")
        submit_refund(client, idempotency_key="slot-small-0001", request=small, app_version="0.1.0")

        def finished() -> Any:
            found = client.list_workflows(workflow_ids=["slot-small-0001"], load_input=False, load_output=False)
            return found and found[0].status == "SUCCESS"

        wait_for(finished, timeout=20, what="the small refund to run while the big one waits")
    finally:
        client.destroy()
        runtime.stop()
