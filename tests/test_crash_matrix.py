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
from agent.domain import RefundRequest
from agent.processes import child_env, spawn, stop, wait_for
from agent.submit import submit_refund
from steps import audit
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database
from tests.conftest import Env
from tests.fake_openai import FakeOpenAIServer, ScriptedModel

MODEL_REQUESTS_PER_REFUND = 4  # get_order, get_refund_history, request_refund, final answer

# point -> (order, needs approval, provider create calls expected)
MATRIX = {
    "after_model_response": ("ord_1001", False, 1),
    "before_provider_call": ("ord_1001", False, 1),
    "after_provider_call": ("ord_1001", False, 2),
    "while_parked": ("ord_1002", True, 1),
    "after_approval_received": ("ord_1002", True, 1),
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
        open_app_database(settings.app_database_url)
        seed(app_db().engine)
        self.client: DBOSClient = runtime.client(settings)

    def worker(self, name: str, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        extra = {"REFUND_AGENT_CRASH_AT": crash_at} if crash_at else {}
        proc = spawn(["worker"], env={**self.vars, **extra}, log=self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc

    def approve(self, refund_id: str) -> None:
        approvals.decide_pending(self.client, refund_id=refund_id, decision="approve", approver="dana")

    def status(self, refund_id: str) -> str | None:
        found = self.client.list_workflows(workflow_ids=[refund_id], load_input=False, load_output=False)
        return found[0].status if found else None

    def finished(self, refund_id: str, timeout: float = 120) -> Any:
        wait_for(lambda: self.status(refund_id) in ("SUCCESS", "ERROR"), timeout=timeout, what="workflow to end")
        return self.client.retrieve_workflow(refund_id).get_result()

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


@pytest.mark.parametrize("point", list(MATRIX))
def test_sigkill_at_named_point_then_restart_pays_exactly_once(
    env: Env, cluster: Cluster, model: ScriptedModel, point: str
) -> None:
    order_id, needs_approval, provider_calls = MATRIX[point]
    refund_id = f"crash-{point}"
    first = cluster.worker("worker-1", crash_at=None if point == "while_parked" else point)
    request = RefundRequest(order_id=order_id, message="It arrived broken; please refund it.")
    submit_refund(cluster.client, idempotency_key=refund_id, request=request, app_version="0.1.0")

    if needs_approval:
        wait_for(lambda: approvals.pending_request(cluster.client, refund_id), timeout=90, what="parking")
        if point == "while_parked":
            first.send_signal(signal.SIGKILL)
        else:
            cluster.approve(refund_id)
    code = wait_for(first.poll, timeout=90, what="the first worker to die")
    assert code == -signal.SIGKILL, cluster.dump_logs()
    assert cluster.status(refund_id) == "PENDING"

    cluster.worker("worker-2")
    if point == "while_parked":
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
    steps = cluster.client.list_workflow_steps(refund_id, load_output=False)
    assert [s["function_name"] for s in steps].count("payments.issue_refund") == 1
    assert len({s["function_id"] for s in steps}) == len(steps)
    with app_db().engine.connect() as conn:
        assert audit.verify(conn).ok
        events = [e.event for e in audit.entries(conn, refund_id)]
    assert events.count("refund_paid") == 1
