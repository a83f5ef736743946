"""Workers killed with SIGKILL at named points, then relaunched: one refund, nothing re-run, chain intact.

The model is a local OpenAI-compatible server (real HTTP tool calls) that counts requests; the
provider is the payments sandbox, which counts calls and keeps the ledger. Both outlive the worker.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient

from agent import approvals, runtime
from agent.approvals import family
from agent.domain import RefundRequest
from agent.ops.processes import child_env, spawn, stop, wait_for
from agent.settlement import settlement_prefix
from agent.status import parked, wait_for_outcome
from agent.submit import submit_refund
from sandbox.model import FakeOpenAIServer, ScriptedModel
from steps import audit
from steps.lookups import PAYMENT_RISK_STEP
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database, orders, outbox
from tests.conftest import Env
from tests.evidence_server import EvidenceServer
from tests.identities import DANA, HELPDESK

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


class Cluster:
    def __init__(self, env: Env, llm: FakeOpenAIServer, logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.vars = child_env(
            env.env_vars(REFUND_AGENT_MODEL="scripted", REFUND_AGENT_MODEL_BASE_URL=llm.base_url),
            drop=("REFUND_AGENT_CRASH_AT",),
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        settings = env.settings()
        runtime.migrate_databases(settings)
        open_app_database(settings.database.app_database_url)
        seed(app_db().engine)
        self.client: DBOSClient = runtime.client(settings)

    def worker(self, name: str, crash_at: str | None = None, **more: str) -> subprocess.Popen[bytes]:
        extra = {"REFUND_AGENT_CRASH_AT": crash_at} if crash_at else {}
        proc = spawn(["worker"], env={**self.vars, **extra, **more}, log=self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc

    def approve(self, refund_id: str, *, wait: bool = True) -> None:
        """Approve through the approvals queue; without ``wait``, only enqueue the decision workflow (the worker
        that runs it may be about to die)."""
        run = approvals.decider_via_queue(self.client, timeout=60 if wait else 0)
        try:
            approvals.decide_pending(run, refund_id=refund_id, decision="approve", approver=DANA, via="console")
        except approvals.ApprovalError as error:
            if wait or error.code != "queued":
                raise

    def pending(self, refund_id: str) -> list[str]:
        """The refund's workflows left PENDING (running, or owned by a process that died)."""
        found = self.client.list_workflows(workflow_ids=family(refund_id), load_input=False, load_output=False)
        found += self.client.list_workflows(workflow_id_prefix=settlement_prefix(refund_id), load_output=False)
        return sorted(w.workflow_id for w in found if w.status == "PENDING")

    def finished(self, refund_id: str, timeout: float = 120) -> Any:
        return wait_for_outcome(self.client, refund_id, timeout=timeout)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.client.destroy()
        close_app_database()

    def dump_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("*.log")))


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
def cluster(env: Env, model: ScriptedModel, tmp_path: Path) -> Iterator[Cluster]:
    with FakeOpenAIServer(model) as llm:
        c = Cluster(env, llm, tmp_path / "logs")
        try:
            yield c
        except BaseException:
            print(c.dump_logs())
            raise
        finally:
            c.close()


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
