"""A crash test's cluster: worker processes the test kills and relaunches, a local model server, the payments
sandbox, a DBOS client; and the fixtures that make one per test (tests/test_crash_*.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient

from agent import approvals, runtime
from agent.approvals import family
from agent.ops.processes import child_env, spawn
from agent.settlement import settlement_prefix
from agent.status import wait_for_outcome
from sandbox.model import FakeOpenAIServer, ScriptedModel
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database
from tests.conftest import Env
from tests.identities import DANA


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
        for proc in self.procs:  # killed, not stopped: what a crash test proves is done, and nothing waits for a drain
            if proc.poll() is None:
                proc.kill()
                proc.wait()
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
