"""dbos-argus, the self-hosted DBOS console, run on loopback through a read-only connection to the system database."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from playwright.sync_api import expect, sync_playwright
from sqlalchemy.engine import make_url

from agent.approvals import deadline_id, escalation_id
from agent.ops.checkpoints import NAME
from agent.ops.processes import free_port, wait_for
from agent.settings import Settings
from agent.status import wait_for_outcome
from steps import audit
from tests import web
from tests.conftest import BACKENDS, Env, SandboxServer, drop_databases, make_databases
from tests.evidence_server import EvidenceServer
from tests.test_console_browser import CHROMIUM
from tests.test_workflow import parked, running, submit

pytest.importorskip("dbos_argus", reason="dbos-argus is installed on its own (Python >= 3.12 declared): see .ci/run")

ARGUS = Path(sys.executable).parent / "dbos-argus"


@dataclass
class Viewer:
    """One backend's system database with a paid and a parked refund, and dbos-argus reading it."""

    backend: str
    system_url: str
    read_only_url: str
    """How argus connects: SQLite opened read-only, or a Postgres role with SELECT on the dbos schema only."""
    http: httpx.Client
    paid: str
    parked: str


def documented_role() -> list[str]:
    """The statements docs/operations/dbos-console.md gives for argus's Postgres role (the block under its marker)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "operations" / "dbos-console.md").read_text()
    block = page.split("<!-- argus-role -->\n```sql\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def read_only_url(backend: str, system_url: str) -> tuple[str, str | None]:
    """A URL through which argus can only read the system database (and the Postgres role made for it, as the
    documentation says)."""
    if backend == "sqlite":
        return f"sqlite:///file:{system_url.removeprefix('sqlite:///')}?mode=ro&uri=true", None
    role, password = f"argus_{secrets.token_hex(4)}", secrets.token_hex(8)
    with psycopg.connect(system_url, autocommit=True) as conn:
        [(service_role,)] = conn.execute("SELECT current_user").fetchall()
        for statement in documented_role():
            named = statement.replace("argus_viewer", role).replace("<service role>", service_role)
            conn.execute(named.replace("<password>", password))
    url = make_url(system_url).set(drivername="postgresql", username=role, password=password)
    return url.render_as_string(hide_password=False), role


def drop_role(system_url: str, role: str) -> None:
    with psycopg.connect(system_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


@pytest.fixture(scope="module", params=BACKENDS)
def viewer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, evidence_sandbox: EvidenceServer
) -> Iterator[Viewer]:
    backend = request.param
    tmp_path = tmp_path_factory.mktemp(f"argus-{backend}")
    dbs = make_databases(backend, tmp_path)
    sandbox = SandboxServer(f"sqlite:///{tmp_path}/sandbox.sqlite")
    env = Env(backend, dbs, tmp_path / "data", sandbox, evidence_sandbox)
    audit.use_key(env.settings().audit_key())
    role = None
    argus = None
    http = None
    try:
        with running(env) as client:
            paid = submit(client, "argus:paid.1", "ord_1001", "The mouse stopped working.")
            waiting = submit(client, "argus-parked-1", "ord_1002", "Please refund 150.00", amount=Decimal("150.00"))
            assert wait_for_outcome(client, paid)["status"] == "completed"
            parked(client, waiting)
        url, role = read_only_url(backend, dbs.system_url)
        port, log = free_port(), tmp_path / "argus.log"
        with log.open("wb") as out:  # as an operator starts it: loopback only, the read-only URL
            argus = subprocess.Popen(
                [str(ARGUS), "--db-url", url, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        http = web.client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_for(lambda: up(http, argus, log), timeout=30, what="dbos-argus to answer", interval=0.1)
        yield Viewer(backend, dbs.system_url, url, http, paid, waiting)
    finally:
        if http is not None:
            http.close()
        if argus is not None:
            argus.terminate()
            argus.wait(timeout=10)
        if role is not None:
            drop_role(dbs.system_url, role)
        audit.use_key(None)
        sandbox.close()
        drop_databases(dbs)


def engine_for(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=sa.NullPool)


def up(http: httpx.Client, argus: subprocess.Popen[bytes], log: Path) -> bool:
    if argus.poll() is not None:
        raise AssertionError(f"dbos-argus exited {argus.returncode}: {log.read_text()}")
    try:
        return bool(http.get("/healthz").json()["database"] == "up")
    except httpx.TransportError:
        return False


def step_output(viewer: Viewer, workflow_id: str, name: str) -> Any:
    """A step's output as argus serves it: its decoded JSON, after checking the stored text is that JSON."""
    detail = viewer.http.get(f"/api/workflows/{quote(workflow_id, safe='')}").json()
    [step] = [s for s in detail["steps"] if s["workflow_id"] == workflow_id and s["function_name"] == name]
    shown = viewer.http.get(f"/api/workflows/{quote(workflow_id, safe='')}/steps/{step['function_id']}/result")
    result = shown.json()
    assert result["serialization"] == NAME and json.loads(result["output"]) == json.loads(result["output_decoded"])
    return json.loads(result["output_decoded"])


def status_rows(viewer: Viewer) -> list[tuple[Any, ...]]:
    engine = engine_for(viewer.system_url)
    try:
        with engine.connect() as conn:
            table = "workflow_status" if viewer.backend == "sqlite" else "dbos.workflow_status"
            rows = conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY workflow_uuid")).all()  # noqa: S608
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]


def test_argus_reads_the_system_database_and_names_it_without_its_password(viewer: Viewer) -> None:
    health = viewer.http.get("/healthz").json()
    assert health["database"] == "up" and health["database_dialect"] == viewer.backend
    password = make_url(viewer.read_only_url).password
    assert password is None or str(password) not in json.dumps(health)


def test_argus_lists_each_refund_with_the_timers_of_the_one_waiting_for_a_person(viewer: Viewer) -> None:
    listed = viewer.http.get("/api/workflows", params={"limit": 200, "grouped": "false"}).json()
    seen = {w["workflow_id"]: (w["name"], w["status"]) for w in listed}
    assert seen[viewer.paid] == ("refund", "SUCCESS") and seen[viewer.parked] == ("refund", "SUCCESS")
    assert seen[deadline_id(viewer.parked)] == ("approval_deadline_workflow", "DELAYED")
    assert seen[escalation_id(viewer.parked)] == ("approval_escalation_workflow", "DELAYED")
    family = viewer.http.get(f"/api/workflows/{quote(deadline_id(viewer.parked), safe='')}").json()["family"]
    assert {w["workflow_id"] for w in family} >= {viewer.parked, deadline_id(viewer.parked)}


def test_argus_shows_a_paid_refunds_steps_by_name_and_its_evidence_and_payment_as_json(viewer: Viewer) -> None:
    detail = viewer.http.get(f"/api/workflows/{viewer.paid}").json()
    names = [s["function_name"] for s in detail["steps"] if s["workflow_id"] == viewer.paid]
    assert names.index("orders.review_case") < names.index("evidence.track_shipment")
    assert names.index("refunds.record_verdict_and_reserve") < names.index("payments.issue_refund")
    proposal = step_output(viewer, viewer.paid, "refund_agent__model.request")["value"]["parts"][0]["args"]
    assert proposal["amount"] == "42.00" and "auto_approve" in proposal["reason"]
    tracking = step_output(viewer, viewer.paid, "evidence.track_shipment")
    assert tracking["type"] == "steps.evidence:Tracking" and tracking["value"]["status"] == "delivered"
    paid = step_output(viewer, viewer.paid, "payments.issue_refund")["value"]
    assert paid["idempotency_key"] == f"refund:{viewer.paid}:ord_1001" and paid["status"] == "succeeded"
    outcome = viewer.http.get(f"/api/workflows/{viewer.paid}/result").json()
    assert outcome["serialization"] == NAME
    assert json.loads(outcome["output_decoded"])["status"] == "completed"


def test_argus_shows_what_a_parked_refund_waits_for(viewer: Viewer) -> None:
    request = step_output(viewer, viewer.parked, "refunds.open_approval")
    assert request["type"] == "steps.records:ApprovalRequest"
    assert request["value"]["amount"] == "150.00" and "needs_approval" in request["value"]["reason"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_argus_offers_no_way_to_change_a_workflow(viewer: Viewer, method: str) -> None:
    before = status_rows(viewer)
    for target in (viewer.parked, deadline_id(viewer.parked)):
        for action in ("cancel", "resume", "restart", "fork", ""):
            path = f"/api/workflows/{quote(target, safe='')}/{action}".rstrip("/")
            assert viewer.http.request(method, path, json={}).status_code in (404, 405), (method, path)
    assert status_rows(viewer) == before


def test_argus_database_connection_can_read_but_not_write(viewer: Viewer) -> None:
    table = "workflow_status" if viewer.backend == "sqlite" else "dbos.workflow_status"
    engine = engine_for(viewer.read_only_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() >= 4  # noqa: S608
            cancel = sa.text(f"UPDATE {table} SET status = 'CANCELLED' WHERE workflow_uuid = :w")  # noqa: S608
            with pytest.raises(sa.exc.DBAPIError, match=r"readonly|permission denied"):
                conn.execute(cancel, {"w": viewer.parked})
    finally:
        engine.dispose()


def test_the_consoles_dbos_link_opens_argus_on_that_workflow(viewer: Viewer) -> None:
    """A fresh page (as a click from the operator console opens) on each kind of id: a refund's, with a colon, and
    its timer's, with a slash."""
    console = Settings(refund_agent_dbos_console_url=f"{viewer.http.base_url}/#/workflows/{{workflow_id}}").console
    with sync_playwright() as playwright:  # in the test: its event loop must not outlive it (DBOS's calls refuse one)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        try:
            for workflow_id, name in (
                (viewer.paid, "refund"),
                (deadline_id(viewer.parked), "approval_deadline_workflow"),
            ):
                link = console.dbos_console_link(workflow_id)
                assert link is not None
                page = browser.new_page()
                page.goto(link)
                expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=15_000)
                expect(page.get_by_text(workflow_id, exact=True).first).to_be_visible()
                expect(page.get_by_text("Not Found")).to_have_count(0)
                page.close()
        finally:
            browser.close()
