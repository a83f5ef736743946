"""The operator's tools: the refund-agent CLI, the audit chain check, the dbos CLI, and the demo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOSClient

from agent import runtime
from agent.approvals import deadline_id
from agent.cli import os_user
from agent.ops.processes import child_env, wait_for
from agent.status import parked, wait_for_outcome
from steps import audit
from steps.seed import ORDERS, seed
from steps.store import app_db, audit_log
from tests import zygote
from tests.conftest import Env

REPO = Path(__file__).resolve().parents[1]


def cli(env: Env, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return zygote.run(args, env=child_env(env.env_vars()), cwd=cwd)


def test_cli_submits_approves_once_and_reports_status(env: Env, client: DBOSClient, tmp_path: Path) -> None:
    """The help desk's client submits (its key in a file); the OS user running the CLI approves."""
    made = cli(env, "clients", "add", "helpdesk", "--scopes", "refunds:create,refunds:read")
    assert made.returncode == 0 and made.stdout.count("\n") == 1, made.stderr  # the key alone on stdout
    key_file = tmp_path / "helpdesk.key"
    key_file.write_text(made.stdout)
    args = ("submit", "ord_1002", "--message", "Broken on arrival", "--key", "cli-refund-0001")
    submitted = cli(env, *args, "--api-key-file", str(key_file))
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: parked(client, "cli-refund-0001"), timeout=60, what="the refund to park")
    approved = cli(env, "approve", "cli-refund-0001")
    assert approved.returncode == 0 and f"approve by cli:{os_user()}" in approved.stdout, approved.stderr
    rejected = cli(env, "reject", "cli-refund-0001")
    assert rejected.returncode == 3 and "recorded earlier" in rejected.stdout
    wait_for_outcome(client, "cli-refund-0001")
    assert len(env.sandbox.refunds("ch_ord_1002")) == 1
    # The decision made the deadline due: it runs, finds the refund approved, and ends.
    wait_for(lambda: _finished(client, deadline_id("cli-refund-0001")), timeout=60, what="the deadline timer to end")
    _status_is_a_summary_and_json_on_request(env, approver=f"cli:{os_user()}")
    steps = cli(env, "steps", "cli-refund-0001")  # one line per step, readable in a terminal
    assert steps.returncode == 0, steps.stderr
    lines = steps.stdout.splitlines()
    assert all(len(line) < 120 for line in lines)
    rows = [line.split() for line in lines if line.split()[1:2] and line.split()[1].isdigit()]
    assert ["(refund)", "1", "orders.review_case"] in [row[:3] for row in rows]
    assert ["/settle", "4", "payments.issue_refund"] in [row[:3] for row in rows]
    started = [row[3] for row in rows]
    assert started == sorted(started), "steps are listed in the order they started, across the workflows"
    [expiry] = [line for line in lines if "refunds.expire_approval" in line]
    assert expiry.endswith("found it approved: nothing expired"), expiry  # the refund did not expire
    assert "approval_deadline_workflow: SUCCESS (found it approved: nothing expired)" in steps.stdout
    assert cli(env, "steps", "no-such-refund").returncode == 1


def _finished(client: DBOSClient, workflow_id: str) -> bool:
    return [wf.status for wf in client.list_workflows(workflow_ids=[workflow_id])] == ["SUCCESS"]


def _status_is_a_summary_and_json_on_request(env: Env, *, approver: str) -> None:
    """`status`: the phase, outcome, amounts and the timeline of events, in lines; `--json`: the whole record."""
    shown = cli(env, "status", "cli-refund-0001")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "Refund cli-refund-0001 (order ord_1002, requested by client:helpdesk)", lines
    head = lines[1 : lines.index("Timeline (UTC):")]
    fields = {line.split()[0]: " ".join(line.split()[1:]) for line in head}
    assert fields["phase"] == "completed"
    assert fields["outcome"].startswith("completed: paid 4,200.00 USD (provider refund re_")
    assert fields["asked"] == "the order's refundable balance"
    assert (fields["proposed"], fields["approved"]) == ("4,200.00 USD", f"4,200.00 USD by {approver}")
    assert fields["paid"] == "4,200.00 USD"
    timeline = lines[lines.index("Timeline (UTC):") + 1 :]
    events = [line.split(None, 2)[2] for line in timeline if line.startswith("  ")]
    assert events[0] == "requested by client:helpdesk, for the order's refundable balance"
    assert f"approved by {approver} via cli for 4,200.00 USD" in events
    assert events[-1].startswith("paid 4,200.00 USD: provider refund re_")
    assert len(shown.stdout.splitlines()) < 30 and "{" not in shown.stdout
    whole = cli(env, "status", "cli-refund-0001", "--json")
    record = json.loads(whole.stdout)
    assert record["status"] == "completed" and record["steps"] and record["workflows"]
    assert cli(env, "status", "no-such-refund").returncode == 1


def test_cli_refuses_bad_input_with_a_message(env: Env, service: runtime.Runtime, tmp_path: Path) -> None:
    unknown = cli(env, "submit", "ord_nope", "--message", "hi", "--key", "cli-bad-00001")
    assert unknown.returncode == 2 and "does not exist" in unknown.stderr
    negative = cli(env, "submit", "ord_1001", "--message", "hi", "--amount", "-3", "--key", "cli-bad-00002")
    assert negative.returncode == 2 and "greater than zero" in negative.stderr
    nothing = cli(env, "approve", "no-such-refund")
    assert nothing.returncode == 2 and "not waiting" in nothing.stderr
    typed = cli(env, "approve", "no-such-refund", "--approver", "dana")  # who decides is not typed
    assert typed.returncode == 2 and "unrecognized arguments: --approver" in typed.stderr
    forged = tmp_path / "forged.key"
    forged.write_text("not-a-key-anyone-was-given-0000000000")
    as_nobody = cli(
        env, "submit", "ord_1001", "--message", "hi", "--key", "cli-bad-00003", "--api-key-file", str(forged)
    )
    assert as_nobody.returncode == 2 and "not a live client" in as_nobody.stderr


def test_audit_verify_reports_the_first_tampered_entry(env: Env, client: DBOSClient) -> None:
    from tests.test_workflow import submit

    refund_id = submit(client, "audit-refund-01", "ord_1001")
    wait_for_outcome(client, refund_id)
    ok = cli(env, "audit", "verify")
    assert ok.returncode == 0 and "intact" in ok.stdout
    with app_db().engine.begin() as conn:
        seq = conn.execute(sa.select(audit_log.c.seq).where(audit_log.c.event == "refund_paid")).scalar_one()
        conn.execute(audit_log.update().where(audit_log.c.seq == seq).values(payload='{"amount": "1.00"}'))
    with app_db().engine.connect() as conn:
        report = audit.verify(conn)
    assert not report.ok and report.first_broken_seq == seq
    broken = cli(env, "audit", "verify")
    assert broken.returncode == 1 and f"entry {seq}" in broken.stdout


def test_audit_verify_notices_a_deleted_entry(env: Env, client: DBOSClient) -> None:
    from tests.test_workflow import submit

    wait_for_outcome(client, submit(client, "audit-refund-02", "ord_1001"))
    with app_db().engine.begin() as conn:
        conn.execute(audit_log.delete().where(audit_log.c.seq == 2))
    with app_db().engine.connect() as conn:
        report = audit.verify(conn)
    assert not report.ok and "missing" in report.problem


def test_dbos_cli_reads_the_same_system_database(env: Env, client: DBOSClient, tmp_path: Path) -> None:
    """`dbos workflow list/steps` from a directory holding our dbos-config.yaml sees our refunds."""
    from tests.test_workflow import submit

    refund_id = submit(client, "dbos-cli-refund-1", "ord_1001")
    wait_for_outcome(client, refund_id)
    dbos = str(Path(sys.executable).parent / "dbos")
    url = ["-s", env.dbs.system_url] if env.backend == "postgres" else []
    shutil.copy(REPO / "dbos-config.yaml", tmp_path / "dbos-config.yaml")
    listed = subprocess.run([dbos, "workflow", "list", *url], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and refund_id in listed.stdout, listed.stderr
    steps = subprocess.run(
        [dbos, "workflow", "steps", refund_id, *url], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "payments.issue_refund" in steps.stdout, steps.stderr


def test_demo_runs_end_to_end_from_a_fresh_directory(tmp_path: Path) -> None:
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith(("DBOS_", "REFUND_AGENT_"))}
    env.pop("DATABASE_URL", None)
    env.pop("PAYMENTS_API_BASE", None)
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "checks passed" in done.stdout


def test_seed_is_idempotent(env: Env, service: runtime.Runtime) -> None:
    assert seed(app_db().engine) == 0
    assert seed(app_db().engine, reset=True) == len(ORDERS)
