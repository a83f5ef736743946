"""DBOS's own CLI (`dbos workflow list/get/steps/cancel/resume/fork`) on our system database, through the
repository's dbos-config.yaml (copied next to the test's embedded-default data directory)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent import approvals, runtime
from agent.approval_workflows import decide_here
from agent.approvals import deadline_id, escalation_id, settle_id
from agent.ops.processes import free_port, http_ok, spawn, stop, wait_for
from agent.settings import Settings
from agent.status import wait_for_outcome
from steps import audit
from steps.store import app_db, orders
from tests.conftest import Env
from tests.identities import DANA
from tests.test_secrets import clean_env
from tests.test_workflow import parked, submit

REPO = Path(__file__).resolve().parents[1]


def dbos(env: Env, cwd: Path, *args: str) -> Any:
    """Run `dbos workflow ...` as an operator would; return its JSON output (None when it prints nothing)."""
    shutil.copy(REPO / "dbos-config.yaml", cwd / "dbos-config.yaml")
    url = ["-s", env.dbs.system_url] if env.backend == "postgres" else []  # SQLite: the path in the yaml
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dbos"), "workflow", *args, *url],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_dbos_cli_lists_gets_and_shows_the_steps_of_a_refund(env: Env, client: DBOSClient, tmp_path: Path) -> None:
    refund_id = submit(client, "dbos-cli-get-01", "ord_1001")
    wait_for_outcome(client, refund_id)
    listed = dbos(env, tmp_path, "list", "--name", "refund")
    assert [w["workflow_id"] for w in listed] == [refund_id]
    got = dbos(env, tmp_path, "get", refund_id)
    assert got["status"] == "SUCCESS" and got["name"] == "refund" and got["executor_id"] == "test-executor"
    steps = dbos(env, tmp_path, "steps", refund_id)
    names = [s["function_name"] for s in steps]
    assert names.index("refunds.record_verdict_and_reserve") < names.index("payments.issue_refund")
    # DBOS's CLI has no serializer of ours: it shows each output as the JSON text stored, the case file readable.
    case = json.loads(next(s["output"] for s in steps if s["function_name"] == "orders.review_case"))
    assert case["type"] == "steps.records:CaseFile" and case["value"]["snapshot"]["order"]["order_id"] == "ord_1001"


def test_dbos_cli_shows_a_parked_refunds_timers_then_cancels_and_resumes_its_continuation(
    env: Env, client: DBOSClient, tmp_path: Path
) -> None:
    refund_id = submit(client, "dbos-cli-resume-01", "ord_1002")
    parked(client, refund_id)
    delayed = {w["workflow_id"] for w in dbos(env, tmp_path, "list", "--status", "DELAYED")}
    assert delayed == {deadline_id(refund_id), escalation_id(refund_id)}  # waiting is these rows, nothing runs
    assert dbos(env, tmp_path, "list", "--status", "PENDING") == []
    # The provider answers slowly enough that the CLI's cancel, a new process on a busy machine, lands first.
    env.sandbox.set_faults(latency_ms=10_000)
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    continuation = settle_id(refund_id)
    wait_for(lambda: prepared(client, continuation), timeout=60, what="the payment to start", interval=0.05)
    dbos(env, tmp_path, "cancel", continuation)
    assert dbos(env, tmp_path, "get", continuation)["status"] == "CANCELLED"
    env.sandbox.set_faults(latency_ms=0)
    dbos(env, tmp_path, "resume", continuation)
    assert wait_for_outcome(client, refund_id)["status"] == "completed"
    # The cancelled run's call is answered too (replayed) before the test ends: a step thread left waiting would
    # retry into the next test's provider, which this process then points at.
    wait_for(lambda: env.sandbox.stats().get("create_requests", 0) >= 2, timeout=30, what="the cancelled call")
    assert len(env.sandbox.refunds("ch_ord_1002")) == 1


def prepared(client: DBOSClient, workflow_id: str) -> int | None:
    """The step id of the continuation's payment preparation, once it has completed."""
    steps = {s["function_name"]: s for s in client.list_workflow_steps(workflow_id)}
    step = steps.get("refunds.prepare_approved_payment")
    return step["function_id"] if step and step["completed_at_epoch_ms"] else None


def test_dbos_cli_fork_from_the_payment_step_sends_the_same_key_and_pays_once(
    env: Env, client: DBOSClient, tmp_path: Path
) -> None:
    """Cancelled while the provider applies the refund, then forked from the payment step with the CLI."""
    refund_id = submit(client, "dbos-cli-fork-01", "ord_1002")
    parked(client, refund_id)
    env.sandbox.set_faults(latency_ms=8000)  # the `dbos` CLI (a new process) must cancel inside the call
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    continuation = settle_id(refund_id)
    prepare_step = wait_for(lambda: prepared(client, continuation), timeout=60, what="the payment", interval=0.05)
    dbos(env, tmp_path, "cancel", continuation)
    wait_for(lambda: len(env.sandbox.refunds("ch_ord_1002")) == 1, timeout=30, what="the provider to apply it")
    env.sandbox.set_faults(latency_ms=0)
    fork_id = f"{refund_id}-fork"
    forked = dbos(env, tmp_path, "fork", continuation, "--step", str(prepare_step), "--forked-workflow-id", fork_id)
    assert forked["workflow_id"] == fork_id and forked["forked_from"] == continuation
    outcome = wait_for_outcome(client, refund_id)
    assert outcome["status"] == "completed" and outcome["idempotency_key"] == f"refund:{refund_id}:ord_1002"
    refunds = env.sandbox.refunds("ch_ord_1002")
    assert len(refunds) == 1 and refunds[0]["id"] == outcome["provider_refund_id"]
    with app_db().engine.connect() as conn:
        paid = [e.payload for e in audit.entries(conn, refund_id) if e.event == "refund_paid"]
    assert len(paid) == 1 and paid[0]["replayed"] is True


def test_a_fork_that_records_the_same_payment_again_counts_it_once_in_our_book(
    env: Env, client: DBOSClient, tmp_path: Path
) -> None:
    refund_id = submit(client, "dbos-cli-fork-02", "ord_1001")
    first: dict[str, Any] = wait_for_outcome(client, refund_id)
    assert first["status"] == "completed"

    def refunded() -> int:
        with app_db().engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(orders.c.amount_refunded_minor).where(orders.c.order_id == "ord_1001")
                ).scalar_one()
            )

    before = refunded()
    steps = {s["function_name"]: s["function_id"] for s in client.list_workflow_steps(refund_id)}
    fork_id = f"{refund_id}-fork"
    dbos(
        env,
        tmp_path,
        "fork",
        refund_id,
        "--step",
        str(steps["refunds.record_payment"]),
        "--forked-workflow-id",
        fork_id,
    )
    again: dict[str, Any] = wait_for_outcome(client, fork_id)
    assert again["status"] == "completed" and again["provider_refund_id"] == first["provider_refund_id"]
    assert refunded() == before  # the same provider refund recorded twice adds to the order once
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_conductor_is_optional_and_gets_the_key_only_when_configured(tmp_path: Path) -> None:
    def settings(**values: Any) -> Settings:
        return Settings(refund_agent_data_dir=tmp_path, dbos_system_database_url="postgresql://u@127.0.0.1/x", **values)

    assert "conductor_key" not in runtime.dbos_config(settings())
    configured = settings(dbos_conductor_key="conductor-key-for-test")
    assert runtime.dbos_config(configured).get("conductor_key") == "conductor-key-for-test"
    assert "conductor-key-for-test" not in repr(configured)


@pytest.mark.skipif(importlib.util.find_spec("dbos_enterprise") is not None, reason="dbos-enterprise is installed")
def test_a_conductor_key_without_dbos_enterprise_stops_the_service_at_start_with_dbos_s_error(tmp_path: Path) -> None:
    ports = {name: str(free_port()) for name in ("REFUND_AGENT_PORT", "PAYMENTS_SANDBOX_PORT", "EVIDENCE_SANDBOX_PORT")}
    env = clean_env(tmp_path, DBOS_CONDUCTOR_KEY="conductor-key-for-test-0123456789", **ports)
    log = tmp_path / "serve.log"
    serve = spawn(["serve"], env=env, log=log)
    try:
        wait_for(lambda: serve.poll() is not None, timeout=60, what="serve to stop at start")
    finally:
        stop(serve)
    assert serve.returncode != 0
    assert "Connecting to DBOS Conductor requires the dbos-enterprise package" in log.read_text()
    # The sandboxes it started before DBOS refused are stopped with it, not left running without a parent.
    for name in ("PAYMENTS_SANDBOX_PORT", "EVIDENCE_SANDBOX_PORT"):
        assert not http_ok(f"http://127.0.0.1:{ports[name]}/_sandbox/healthz"), f"the sandbox on {name} is running"
