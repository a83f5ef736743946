"""Workers killed with SIGKILL while the provider settles a pending refund and while a claim is investigated, then
relaunched: settled once, looked up again only what was not checkpointed (the approval path: test_crash_matrix.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.domain import RefundRequest
from agent.ops.processes import wait_for
from agent.submit import submit_refund
from sandbox.model import FakeOpenAIServer, ScriptedModel
from steps import audit
from steps.lookups import PAYMENT_RISK_STEP
from steps.store import app_db, orders, outbox
from tests.conftest import Env
from tests.crash_cluster import Cluster
from tests.evidence_server import EvidenceServer
from tests.identities import HELPDESK

# case -> (kill point, how the provider settles the pending refund, provider create calls expected)
SETTLING = {
    "pending_after_provider_call": ("after_provider_call", "succeeded", 2),
    "pending_after_payment_parked": ("after_payment_parked", "succeeded", 1),
    "pending_failed_after_payment_parked": ("after_payment_parked", "failed", 1),
    "pending_after_payment_settled": ("after_payment_settled", "succeeded", 1),
    "pending_failed_after_payment_settled": ("after_payment_settled", "failed", 1),
}


@pytest.mark.parametrize("case", list(SETTLING))
def test_sigkill_while_the_provider_settles_a_pending_refund_then_restart_settles_it_once(
    env: Env, cluster: Cluster, model: ScriptedModel, case: str
) -> None:
    point, final, provider_calls = SETTLING[case]
    refund_id = f"crash-{case.replace('_', '-')}"
    env.sandbox.set_faults(
        **({"pending_next": 1} if final == "succeeded" else {"pending_fail_next": 1}), settle_after_ms=1500
    )
    recheck = {"PAYMENT_RECHECK_SECONDS": "1"}
    first = cluster.worker("worker-1", crash_at=point, **recheck)
    request = RefundRequest(order_id="ord_1001", message="It arrived broken; please refund it.")
    submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)
    code = wait_for(first.poll, timeout=90, what="the first worker to die")
    assert code == -signal.SIGKILL, cluster.dump_logs()
    assert cluster.pending(refund_id), "the kill left nothing pending"

    cluster.worker("worker-2", **recheck)
    outcome = cluster.finished(refund_id)

    assert outcome["status"] == ("completed" if final == "succeeded" else "failed"), cluster.dump_logs()
    [held] = env.sandbox.refunds("ch_ord_1001")
    assert held["status"] == final
    stats = env.sandbox.stats()
    assert (stats["refunds_applied"], stats["create_requests"]) == (1, provider_calls)
    wait_for(lambda: cluster.pending(refund_id) == [], timeout=30, what="nothing left pending")
    with app_db().engine.connect() as conn:
        assert audit.verify(conn).ok
        events = [e.event for e in audit.entries(conn, refund_id)]
        refunded = conn.execute(orders.select().where(orders.c.order_id == "ord_1001")).one().amount_refunded_minor
        sent = conn.execute(outbox.select().where(outbox.c.refund_id == refund_id)).all()
    assert events.count("refund_paid") == (1 if final == "succeeded" else 0)
    assert events.count("refund_failed") == (0 if final == "succeeded" else 1)
    assert refunded == (4200 if final == "succeeded" else 0)
    assert [m.channel for m in sent] == (["email"] if final == "succeeded" else ["operators"])


# case -> (kill point, order, claim, the look-up step, the service it asks, expected paid amount in minor units)
INVESTIGATING = {
    "after_carrier_answered": ("after_carrier_answered", "ord_1011", "My desk lamp never arrived.", "carrier", 6400),
    "after_warehouse_answered": ("after_warehouse_answered", "ord_1014", "I sent everything back.", "returns", 8000),
    "investigated_after_model_response": (
        "after_model_response",
        "ord_1011",
        "My desk lamp never arrived.",
        "carrier",
        6400,
    ),
}


@pytest.fixture
def own_evidence(env: Env) -> Iterator[Env]:
    """An evidence sandbox of this test's own, so its request counters count this test's look-ups only."""
    server = EvidenceServer()
    try:
        yield Env(env.backend, env.dbs, env.data_dir, env.sandbox, server)
    finally:
        server.stop()


@pytest.mark.parametrize("case", list(INVESTIGATING))
def test_sigkill_while_investigating_then_restart_looks_up_again_only_what_was_not_checkpointed(
    own_evidence: Env, model: ScriptedModel, tmp_path: Path, case: str
) -> None:
    point, order_id, message, service, paid = INVESTIGATING[case]
    env = own_evidence
    assert env.evidence is not None
    refund_id = f"crash-{case.replace('_', '-')}"
    with FakeOpenAIServer(model) as llm:
        cluster = Cluster(env, llm, tmp_path / "logs")
        try:
            first = cluster.worker("worker-1", crash_at=point)
            request = RefundRequest(order_id=order_id, message=message)
            submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)
            code = wait_for(first.poll, timeout=90, what="the first worker to die")
            assert code == -signal.SIGKILL, cluster.dump_logs()
            assert cluster.pending(refund_id), "the kill left nothing pending"
            cluster.worker("worker-2")
            outcome = cluster.finished(refund_id)
            assert outcome["status"] == "completed", cluster.dump_logs()
            steps = [s["function_name"] for s in cluster.client.list_workflow_steps(refund_id, load_output=False)]
            with app_db().engine.connect() as conn:
                assert audit.verify(conn).ok
        finally:
            cluster.close()
    [held] = env.sandbox.refunds(f"ch_{order_id}")
    assert held["amount"] == paid and env.sandbox.stats()["refunds_applied"] == 1
    # Killed before the look-up's checkpoint: asked once more. Killed after it: never asked again.
    asked = env.evidence.stats()[service]
    assert asked == (2 if point.endswith("_answered") else 1)
    # The claim's look-up once; the charge's risk, read by the workflow before paying at once, once too.
    assert sum(name.startswith("evidence.") and name != PAYMENT_RISK_STEP for name in steps) == 1
    assert steps.count(PAYMENT_RISK_STEP) == 1
    # The first model request (which asked for the look-up) was checkpointed before the kill and never re-sent.
    assert model.requests[order_id] == 2
