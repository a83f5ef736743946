"""Workers killed with SIGKILL at named points, then relaunched: one refund, nothing re-run, chain intact (a
pending refund's settlement and an investigation killed: test_crash_settling.py).

The model is a local OpenAI-compatible server (real HTTP tool calls) that counts requests; the
provider is the payments sandbox, which counts calls and keeps the ledger. Both outlive the worker.
"""

from __future__ import annotations

import signal

import pytest

from agent.approvals import family
from agent.domain import RefundRequest
from agent.ops.processes import wait_for
from agent.status import parked
from agent.submit import submit_refund
from sandbox.model import ScriptedModel
from steps import audit
from steps.store import app_db
from tests.conftest import Env
from tests.crash_cluster import Cluster
from tests.identities import HELPDESK

MODEL_REQUESTS_PER_REFUND = 1  # the answer: the case file was read before the model was asked

# case -> (kill point, order, needs approval, provider create calls expected). On the approval path the
# first worker is armed from the start: the deciding workflow parks without paying, so a payment kill
# point fires inside the continuation, and a decision kill point inside the decision workflow.
MATRIX = {
    "after_model_response": ("after_model_response", "ord_1001", False, 1),
    "before_provider_call": ("before_provider_call", "ord_1001", False, 1),
    "after_provider_call": ("after_provider_call", "ord_1001", False, 2),
    "while_parked": (None, "ord_1002", True, 1),
    "after_decision_recorded": ("after_decision_recorded", "ord_1002", True, 1),
    "after_continuation_enqueued": ("after_continuation_enqueued", "ord_1002", True, 1),
    "after_decision_sent": ("after_decision_sent", "ord_1002", True, 1),
    "after_approval_received": ("after_approval_received", "ord_1002", True, 1),
    "approved_before_provider_call": ("before_provider_call", "ord_1002", True, 1),
    "approved_after_provider_call": ("after_provider_call", "ord_1002", True, 2),
}


@pytest.mark.parametrize("case", list(MATRIX))
def test_sigkill_at_named_point_then_restart_pays_exactly_once(
    env: Env, cluster: Cluster, model: ScriptedModel, case: str
) -> None:
    point, order_id, needs_approval, provider_calls = MATRIX[case]
    refund_id = f"crash-{case}"
    first = cluster.worker("worker-1", crash_at=point)
    request = RefundRequest(order_id=order_id, message="It arrived broken; please refund it.")
    submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)

    if needs_approval:
        wait_for(lambda: parked(cluster.client, refund_id), timeout=90, what="parking")
        if point is None:
            first.send_signal(signal.SIGKILL)
        else:
            cluster.approve(refund_id, wait=False)
    code = wait_for(first.poll, timeout=90, what="the first worker to die")
    assert code == -signal.SIGKILL, cluster.dump_logs()
    # A parked refund left nothing running to recover; any other kill leaves the workflow it interrupted.
    left = cluster.pending(refund_id)
    if point is None:
        assert left == [] and parked(cluster.client, refund_id) is not None
    else:
        assert left, "the kill left nothing pending"

    cluster.worker("worker-2")
    if point is None:
        # The parked refund is still parked after the restart; the decision can come now.
        cluster.approve(refund_id)
    outcome = cluster.finished(refund_id)

    assert outcome["status"] == "completed", cluster.dump_logs()
    ledger = env.sandbox.refunds(f"ch_{order_id}")
    assert len(ledger) == 1
    assert ledger[0]["metadata"]["idempotency_key"] == f"refund:{refund_id}:{order_id}"
    stats = env.sandbox.stats()
    assert stats["refunds_applied"] == 1
    assert stats["create_requests"] == provider_calls
    assert model.requests[order_id] == MODEL_REQUESTS_PER_REFUND  # answered requests were not sent again
    payments = 0
    for workflow_id in family(refund_id):
        steps = cluster.client.list_workflow_steps(workflow_id, load_output=False)
        payments += [s["function_name"] for s in steps].count("payments.issue_refund")
        assert len({s["function_id"] for s in steps}) == len(steps)
    assert payments == 1
    # Nothing stuck: the timers a decision made due run and end within a queue poll or two.
    wait_for(lambda: cluster.pending(refund_id) == [], timeout=60, what="the refund's timers to end")
    with app_db().engine.connect() as conn:
        assert audit.verify(conn).ok
        events = [e.event for e in audit.entries(conn, refund_id)]
    assert events.count("refund_paid") == 1
