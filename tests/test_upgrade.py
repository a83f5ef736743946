"""Upgrades: work in flight on release A finishes on release B; a refund parked on A is paid by B alone.

A refund in flight is a PENDING workflow whose recorded steps B replays, so a change to workflow code
must go behind ``DBOS.patch``: release B is a copy of this tree whose refund path gained two steps, one
before the agent runs (refunds started on A are past it: the patch answers False on replay and the old
path is kept) and one right before the payment (refunds stopped on A during their payment call reach
it for the first time on B: the patch answers True and the new step runs). A and B pin the same
``REFUND_AGENT_APP_VERSION``, which is what lets B recover A's PENDING workflows.

A parked refund holds no workflow at all: its deadline, its decision and its continuation are
enqueued without a version and run on whatever release is deployed, so a refund parked on version A
is approved and paid by version B with no worker of A left.

The release before checkpoints were JSON pickled them: that release is a copy of this tree with DBOS's default
serializer and no conversion; refunds it parked are paid by this release, which rewrote their pickled rows as
JSON when it started.
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
import sqlalchemy as sa
from dbos import DBOSClient

from agent import approvals
from agent.approvals import deadline_id, family, settle_id
from agent.domain import RefundRequest
from agent.ops import heartbeat
from agent.ops.checkpoints import NAME, PICKLE
from agent.ops.processes import wait_for
from agent.status import parked
from agent.submit import submit_refund
from steps.store import create_engine
from tests.conftest import Env
from tests.identities import DANA, HELPDESK
from tests.scale_cluster import Cluster
from tests.test_scale import assert_paid_once_each

SOURCE = Path(__file__).resolve().parents[1]
PINNED_VERSION = "compat-1"

DECIDING = "    deps = AgentDeps(refund_id, req, rt.limits, snapshot=case.snapshot)\n"
PAYING = "    try:\n        payment = await call(\n            issue_refund_step,\n"
RELEASE_B_STEPS = """

@DBOS.step(name="release_b.intake_note")
def intake_note_step(refund_id: str) -> str:
    return f"intake noted for {refund_id}"


@DBOS.step(name="release_b.payment_receipt")
def payment_receipt_step(refund_id: str) -> str:
    return f"payment of {refund_id} about to be sent"
"""


def build_release_b(root: Path, *, patched: bool = True) -> Path:
    """A copy of the source tree whose refund path has two new steps, each behind DBOS.patch (or not)."""
    for package in ("agent", "steps", "sandbox"):
        shutil.copytree(SOURCE / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    workflow = root / "agent" / "workflow.py"
    code = workflow.read_text()
    assert DECIDING in code and PAYING in code, "the refund workflow changed: update the upgrade test's anchors"
    guard = '    if await DBOS.patch_async("intake-note"):\n    ' if patched else ""
    code = code.replace(DECIDING, DECIDING + guard + "    intake_note_step(refund_id)\n")
    receipt = "    payment_receipt_step(refund_id)\n"
    if patched:
        receipt = '    if await DBOS.patch_async("payment-receipt"):\n    ' + receipt
    code = code.replace(PAYING, receipt + PAYING)
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
    names: list[str] = []
    for workflow_id in family(refund_id):
        names += [s["function_name"] for s in cluster.client.list_workflow_steps(workflow_id, load_output=False)]
    return names


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


SMALL = RefundRequest(order_id="ord_1001", message="The mouse is broken, please refund 5.00", amount=Decimal("5.00"))


def stop_a_during_payments_then_start_b(env: Env, cluster: Cluster, root: Path) -> list[str]:
    """Three refunds in their payment call on release A when A stops (a redeploy); release B takes them."""
    env.sandbox.set_faults(latency_ms=4000)
    release_a = cluster.worker("release-a", QUEUE_WORKER_CONCURRENCY="8")
    in_flight = [f"upgrade-{i}" for i in range(3)]
    for refund_id in in_flight:
        submit_refund(
            cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=SMALL, app_version=PINNED_VERSION
        )
    wait_for(lambda: _all_paying(cluster, in_flight), timeout=120, what="the payment calls")

    release_a.send_signal(signal.SIGTERM)  # drains for 1 s, then stops: the payments are still in flight
    assert wait_for(release_a.poll, timeout=60, what="release A to stop") == 0
    assert {w.status for w in cluster.statuses(in_flight).values()} == {"PENDING"}
    assert cluster.leases()["release-a"].state == heartbeat.STOPPED
    env.sandbox.set_faults(latency_ms=0)

    start_release(cluster, "release-b", root)
    return in_flight


def _all_paying(cluster: Cluster, refund_ids: list[str]) -> bool:
    from tests.test_scale import _rows_paying

    return _rows_paying(refund_ids)


def test_refunds_in_flight_on_release_a_finish_on_patched_release_b(env: Env, cluster: Cluster, tmp_path: Path) -> None:
    in_flight = stop_a_during_payments_then_start_b(env, cluster, build_release_b(tmp_path / "release-b"))
    fresh = "upgrade-fresh"
    submit_refund(cluster.client, idempotency_key=fresh, requester=HELPDESK, request=SMALL, app_version=PINNED_VERSION)

    final = cluster.wait_done([*in_flight, fresh])
    assert {w.status for w in final.values()} == {"SUCCESS"}
    assert {final[r].executor_id for r in in_flight} == {"release-b"}  # B's sweep took A's refunds over
    assert_paid_once_each(env, cluster, dict.fromkeys([*in_flight, fresh], "ord_1001"))
    for refund_id in in_flight:  # started on A: the old path before the payment, the new one from there on
        names = step_names(cluster, refund_id)
        assert "release_b.intake_note" not in names
        assert names.count("release_b.payment_receipt") == 1 and "DBOS.patch-payment-receipt" in names
    names = step_names(cluster, fresh)  # started on B: every patch applies
    assert names.count("release_b.intake_note") == 1 and names.count("release_b.payment_receipt") == 1


def test_the_same_change_without_a_patch_fails_refunds_started_on_a_and_b_pays_nothing(
    env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    in_flight = stop_a_during_payments_then_start_b(env, cluster, build_release_b(tmp_path / "b", patched=False))
    calls_from_a = env.sandbox.stats().get("create_requests", 0)

    final = cluster.wait_done(in_flight)
    assert {w.status for w in final.values()} == {"ERROR"}  # replay found a step where A had recorded another
    assert env.sandbox.stats().get("create_requests", 0) == calls_from_a  # B sent no payment at all


def test_a_refund_parked_under_version_a_is_paid_once_by_a_worker_of_version_b(env: Env, cluster: Cluster) -> None:
    release_a = cluster.worker("release-a", REFUND_AGENT_APP_VERSION="A")
    waiting = [f"parked-on-a-{i}" for i in range(3)]
    request = RefundRequest(order_id="ord_1002", message="Please refund 150.00", amount=Decimal("150.00"))
    for refund_id in waiting:
        submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)
    for refund_id in waiting:
        wait_for(lambda r=refund_id: parked(cluster.client, r), timeout=120, what="parking")  # type: ignore[misc]
    release_a.send_signal(signal.SIGTERM)
    assert wait_for(release_a.poll, timeout=60, what="release A to stop") == 0
    assert {w.app_version for w in cluster.statuses(waiting).values()} == {"A"}  # decided on A
    deadlines = cluster.statuses([deadline_id(r) for r in waiting]).values()
    assert {(w.status, w.app_version) for w in deadlines} == {("DELAYED", None)}

    cluster.worker("release-b", REFUND_AGENT_APP_VERSION="B")  # no worker of A runs from here on
    decider = approvals.decider_via_queue(cluster.client)
    for refund_id in waiting:
        approvals.decide_pending(decider, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    final = cluster.wait_done([settle_id(r) for r in waiting])
    assert {(w.status, w.executor_id, w.app_version) for w in final.values()} == {("SUCCESS", "release-b", "B")}
    assert_paid_once_each(env, cluster, dict.fromkeys(waiting, "ord_1002"))


CONFIGURED = '        "serializer": SERIALIZER,  # checkpoints as JSON, never pickle (agent/ops/checkpoints.py)\n'
CLIENT_SERIALIZER = ", serializer=SERIALIZER)"
CONVERTS = "        secure_checkpoints(engine)\n"


def build_pickling_release(root: Path) -> Path:
    """A copy of this tree as the release before JSON checkpoints: DBOS's default serializer (pickle), no conversion."""
    for package in ("agent", "steps", "sandbox"):
        shutil.copytree(SOURCE / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    runtime = root / "agent" / "runtime.py"
    code = runtime.read_text()
    assert CONFIGURED in code and CLIENT_SERIALIZER in code and CONVERTS in code, "update the upgrade test's anchors"
    code = code.replace(CONFIGURED, "").replace(CLIENT_SERIALIZER, ")").replace(CONVERTS, "        pass\n")
    runtime.write_text(code)
    return root


def serializations(env: Env) -> set[str | None]:
    """Every label DBOS's rows carry (workflows, steps, messages), read with plain SQL."""
    engine = create_engine(env.dbs.system_url)
    prefix = "" if env.backend == "sqlite" else "dbos."
    try:
        with engine.connect() as conn:
            return {
                label
                for table in ("workflow_status", "operation_outputs", "notifications")
                for (label,) in conn.execute(sa.text(f"SELECT DISTINCT serialization FROM {prefix}{table}"))  # noqa: S608
            }
    finally:
        engine.dispose()


def as_the_pickling_release_left_it(env: Env) -> None:
    """The system database without this release's relabelling trigger (the test's cluster migrated it first)."""
    engine = create_engine(env.dbs.system_url)
    try:
        with engine.begin() as conn:
            if env.backend == "sqlite":
                names = conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars()
                for name in [n for n in names if n.startswith("refund_agent_no_pickle")]:
                    conn.execute(sa.text(f"DROP TRIGGER {name}"))
            else:
                conn.execute(sa.text("DROP FUNCTION dbos.refund_agent_no_pickle() CASCADE"))
    finally:
        engine.dispose()


def test_refunds_parked_by_the_pickling_release_are_paid_once_after_the_upgrade_to_json_checkpoints(
    env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    as_the_pickling_release_left_it(env)
    start_release(cluster, "release-a", build_pickling_release(tmp_path / "pickling"))
    pickling_client = DBOSClient(system_database_url=env.dbs.system_url)  # as that release's callers were
    try:
        waiting = [f"parked-pickled-{i}" for i in range(2)]
        request = RefundRequest(order_id="ord_1002", message="Please refund 150.00", amount=Decimal("150.00"))
        for refund_id in waiting:
            submit_refund(pickling_client, idempotency_key=refund_id, requester=HELPDESK, request=request)
        for refund_id in waiting:
            wait_for(lambda r=refund_id: parked(pickling_client, r), timeout=120, what="parking")  # type: ignore[misc]
    finally:
        pickling_client.destroy()
    cluster.procs["release-a"].send_signal(signal.SIGTERM)
    assert wait_for(cluster.procs["release-a"].poll, timeout=60, what="the pickling release to stop") == 0
    assert PICKLE in serializations(env)  # that release really wrote pickles

    cluster.worker("release-b")  # this release: converts the pickled rows before DBOS launches
    assert PICKLE not in serializations(env) and NAME in serializations(env)
    decider = approvals.decider_via_queue(cluster.client)
    for refund_id in waiting:
        assert parked(cluster.client, refund_id) is not None  # readable through the JSON client
        approvals.decide_pending(decider, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    final = cluster.wait_done([settle_id(r) for r in waiting])
    assert {(w.status, w.executor_id) for w in final.values()} == {("SUCCESS", "release-b")}
    assert_paid_once_each(env, cluster, dict.fromkeys(waiting, "ord_1002"))
