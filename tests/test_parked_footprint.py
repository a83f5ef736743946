"""What a refund parked for approval costs the worker that holds it, for as long as it waits.

A worker keeps every refund it parked in memory (its workflow's frame, suspended in ``DBOS.recv``) for
up to APPROVAL_TIMEOUT_SECONDS, and thousands can wait at once. Two things keep that cheap: a parked
refund holds what the rest of its workflow needs, not the agent's conversation, and the objects built
at start-up stay out of the garbage collector's full collections, which stop the whole process
(benchmarks/README.md, "Parked approvals").
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from dbos import DBOSClient
from pydantic_ai.messages import ModelRequest, ModelResponse

from agent import approvals, runtime
from agent.domain import RefundRequest
from agent.processes import wait_for
from agent.submit import submit_refund
from steps.seed import seed
from steps.store import app_db
from tests.conftest import Env


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def _pending(client: DBOSClient, refund_id: str) -> dict[str, Any]:
    return wait_for(lambda: approvals.pending_request(client, refund_id), timeout=60, what="approval request")


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_a_parked_refund_keeps_its_proposal_but_not_the_agent_conversation(env: Env) -> None:
    rt = runtime.start(env.settings())
    seed(app_db().engine)
    client: DBOSClient = runtime.client(rt.settings)
    try:
        before = _live(ModelResponse), _live(ModelRequest)
        for n in range(3):
            request = RefundRequest(order_id="ord_1002", message="Everything arrived broken.")
            submit_refund(client, idempotency_key=f"footprint-{n:04d}", request=request, app_version="0.1.0")
        for n in range(3):
            pending = _pending(client, f"footprint-{n:04d}")
            assert pending["amount"] == "4200.00"
        # Each agent run exchanged several model requests and responses; none of them outlives the run.
        assert (_live(ModelResponse), _live(ModelRequest)) == before
        approvals.decide_pending(client, refund_id="footprint-0000", decision="approve", approver="dana")
        outcome: dict[str, Any] = client.retrieve_workflow("footprint-0000").get_result(polling_interval_sec=0.1)
        assert outcome["status"] == "completed"  # the kept proposal and order are enough to pay
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
