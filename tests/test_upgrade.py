"""Upgrades: refunds parked on release A finish on release B, whose workflow code changed under DBOS.patch.

Release A is this source tree. Release B is a copy of it whose refund workflow gained two steps, each
behind ``DBOS.patch_async``: one before the agent runs (refunds started on A are past that point, so
the patch answers False on replay and the old path is kept) and one after the approval (refunds
parked on A reach it for the first time on B, so the patch answers True and the new step runs). Both
releases pin the same ``REFUND_AGENT_APP_VERSION``, which is what lets B recover A's workflows.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from agent import approvals, heartbeat
from agent.domain import RefundRequest
from agent.processes import wait_for
from agent.submit import submit_refund
from tests.conftest import Env
from tests.scale_cluster import Cluster
from tests.test_scale import assert_paid_once_each

SOURCE = Path(__file__).resolve().parents[1]
PINNED_VERSION = "compat-1"

DECIDING = "    deps = AgentDeps(refund_id, req, rt.limits)\n"
APPROVED = (
    "            refund_id, verdict, reason=proposal.reason, config=rt.approvals, publish_phase=not lean\n        )\n"
)
LEAN = "    lean = await DBOS.patch_async(LEAN_CHECKPOINTS)\n"
RELEASE_B_STEPS = """

@DBOS.step(name="release_b.intake_note")
def intake_note_step(refund_id: str) -> str:
    return f"intake noted for {refund_id}"


@DBOS.step(name="release_b.approval_receipt")
def approval_receipt_step(refund_id: str, approver: str) -> str:
    return f"approval of {refund_id} by {approver} received"
"""


def build_release_b(root: Path, *, patched: bool = True) -> Path:
    """A copy of the source tree whose workflow has two new steps, each behind DBOS.patch (or not)."""
    for package in ("agent", "steps", "sandbox"):
        shutil.copytree(SOURCE / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    workflow = root / "agent" / "workflow.py"
    code = workflow.read_text()
    assert DECIDING in code and APPROVED in code, "the refund workflow changed: update the upgrade test's anchors"
    guard = '    if await DBOS.patch_async("intake-note"):\n    ' if patched else ""
    code = code.replace(DECIDING, DECIDING + guard + "    intake_note_step(refund_id)\n")
    code = code.replace(
        APPROVED,
        APPROVED
        + '        if await DBOS.patch_async("approval-receipt"):\n'
        + "            approval_receipt_step(refund_id, decision.approver)\n",
    )
    workflow.write_text(code + RELEASE_B_STEPS)
    return root


@pytest.fixture
def cluster(env: Env, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(
        env,
        tmp_path / "logs",
        REFUND_AGENT_APP_VERSION=PINNED_VERSION,
        SHUTDOWN_TIMEOUT_SECONDS="1",
        EXECUTOR_HEARTBEAT_SECONDS="0.5",
    )
    try:
        yield c
    except BaseException:
        print(c.dump_logs())
        raise
    finally:
        c.close()


def step_names(cluster: Cluster, refund_id: str) -> list[str]:
    return [s["function_name"] for s in cluster.client.list_workflow_steps(refund_id, load_output=False)]


def build_release_before_lean_checkpoints(root: Path) -> Path:
    """A copy of the source tree as it ran before the lean-checkpoints patch: every refund takes the old path."""
    for package in ("agent", "steps", "sandbox"):
        shutil.copytree(SOURCE / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    workflow = root / "agent" / "workflow.py"
    code = workflow.read_text()
    assert LEAN in code, "the refund workflow changed: update the upgrade test's anchors"
    workflow.write_text(code.replace(LEAN, "    lean = False\n"))
    return root


def start_release(cluster: Cluster, name: str, root: Path) -> subprocess.Popen[bytes]:
    cluster.logs.mkdir(parents=True, exist_ok=True)
    log = (cluster.logs / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "worker"],
        cwd=root,  # `python -m` puts the working directory first on sys.path: that release's code is imported
        env={**cluster.vars, "REFUND_AGENT_EXECUTOR_ID": name, "QUEUE_WORKER_CONCURRENCY": "8"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()  # the child holds its own copy of the descriptor
    cluster.procs[name] = proc
    cluster.wait_running(name, proc)
    return proc


def park_on_a_then_start_b(cluster: Cluster, root: Path, *, release_a_root: Path | None = None) -> list[str]:
    """Three refunds parked for approval on release A; A stopped; release B running and holding them."""
    if release_a_root is None:
        release_a = cluster.worker("release-a", QUEUE_WORKER_CONCURRENCY="8")
    else:
        release_a = start_release(cluster, "release-a", release_a_root)
    parked = [f"upgrade-{i}" for i in range(3)]
    request = RefundRequest(order_id="ord_1002", message="Please refund 150.00", amount=Decimal("150.00"))
    for refund_id in parked:
        submit_refund(cluster.client, idempotency_key=refund_id, request=request, app_version=PINNED_VERSION)
    wait_for(lambda: all(approvals.pending_request(cluster.client, r) for r in parked), timeout=120, what="parking")

    release_a.send_signal(signal.SIGTERM)  # a redeploy: A stops; the parked refunds stay PENDING under its id
    assert wait_for(release_a.poll, timeout=60, what="release A to stop") == 0
    assert {w.status for w in cluster.statuses(parked).values()} == {"PENDING"}
    assert cluster.leases()["release-a"].state == heartbeat.STOPPED

    start_release(cluster, "release-b", root)
    # Release B's sweep hands the stopped executor's refunds to the queue, and B takes them.
    wait_for(
        lambda: {w.executor_id for w in cluster.statuses(parked).values()} == {"release-b"},
        timeout=60,
        what="release B to take over the parked refunds",
    )
    for refund_id in parked:
        approvals.decide_pending(cluster.client, refund_id=refund_id, decision="approve", approver="dana")
    return parked


def approve_a_fresh_refund_then_finish_all(env: Env, cluster: Cluster, parked: list[str]) -> str:
    """A refund started on the running release, approved; it and the parked ones succeed, each paid once."""
    request = RefundRequest(order_id="ord_1002", message="Please refund 150.00", amount=Decimal("150.00"))
    fresh = "upgrade-fresh"
    submit_refund(cluster.client, idempotency_key=fresh, request=request, app_version=PINNED_VERSION)
    wait_for(lambda: approvals.pending_request(cluster.client, fresh), timeout=90, what="the new refund to park")
    approvals.decide_pending(cluster.client, refund_id=fresh, decision="approve", approver="dana")

    final = cluster.wait_done([*parked, fresh])
    assert {w.status for w in final.values()} == {"SUCCESS"}
    assert_paid_once_each(env, cluster, dict.fromkeys([*parked, fresh], "ord_1002"))
    return fresh


def test_refunds_parked_on_release_a_finish_on_patched_release_b(env: Env, cluster: Cluster, tmp_path: Path) -> None:
    parked = park_on_a_then_start_b(cluster, build_release_b(tmp_path / "release-b"))
    fresh = approve_a_fresh_refund_then_finish_all(env, cluster, parked)
    for refund_id in parked:  # started on A: the old path before the park point, the new one after it
        names = step_names(cluster, refund_id)
        assert "release_b.intake_note" not in names
        assert names.count("release_b.approval_receipt") == 1
        assert "DBOS.patch-approval-receipt" in names
    names = step_names(cluster, fresh)  # started on B: every patch applies
    assert names.count("release_b.intake_note") == 1
    assert names.count("release_b.approval_receipt") == 1


def test_the_same_change_without_a_patch_fails_refunds_started_on_a_and_pays_nothing(
    env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    parked = park_on_a_then_start_b(cluster, build_release_b(tmp_path / "release-b", patched=False))

    final = cluster.wait_done(parked)
    assert {w.status for w in final.values()} == {"ERROR"}  # replay found a step where A had recorded another
    assert env.sandbox.stats().get("create_requests", 0) == 0


def test_refunds_parked_before_the_lean_checkpoints_patch_finish_on_the_old_path_and_pay_once(
    env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    old = build_release_before_lean_checkpoints(tmp_path / "release-a")
    parked = park_on_a_then_start_b(cluster, SOURCE, release_a_root=old)
    fresh = approve_a_fresh_refund_then_finish_all(env, cluster, parked)
    for refund_id in parked:  # started before the patch: phase events and a separate customer notification
        names = step_names(cluster, refund_id)
        assert "DBOS.patch-lean-checkpoints" not in names
        assert names.count("DBOS.setEvent") == 6 and names.count("notify.customer") == 1
        assert cluster.client.get_event(refund_id, "phase", timeout_seconds=0) == "completed"
    names = step_names(cluster, fresh)  # started after it: one approval-request event, the message rides the book
    assert names[0] == "DBOS.patch-lean-checkpoints"
    assert names.count("DBOS.setEvent") == 1 and "notify.customer" not in names
    assert names.count("orders.load_order") == 1
