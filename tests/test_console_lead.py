"""The console as a support lead reads it: refund phases, actions in plain words, what was paid, the audit log
across refunds with its filters, and HTML error pages under /console (the API keeps problem+json)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agent.approvals import deadline_id
from agent.console import install_error_pages
from agent.console.pages import ConsoleState
from agent.console.phases import phase_of
from agent.http import problems
from agent.status import wait_for_outcome
from steps import audit
from steps.store import app_db, audit_log
from tests import web
from tests.conftest import Env
from tests.console_server import ConsoleServer, console_server, csrf_of, form
from tests.test_workflow import parked, submit


@pytest.mark.parametrize(
    ("row_status", "decision", "phase"),
    [
        ("received", None, "deciding"),
        ("awaiting_approval", None, "parked"),
        ("awaiting_approval", "approve", "paying"),
        ("awaiting_approval", "expired", "expired"),
        ("settling", "approve", "settling"),
        ("completed", "approve", "paid"),
        ("completed", None, "paid"),
        ("rejected", None, "refused"),
        ("rejected", "reject", "refused"),
        ("rejected", "expired", "expired"),
        ("failed", None, "failed"),
        ("cancelled", None, "cancelled"),
    ],
)
def test_a_refunds_phase_comes_from_its_row_and_its_decision(row_status: str, decision: str | None, phase: str) -> None:
    assert phase_of(row_status, decision).key == phase


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def pill(html: str) -> str:
    found = re.search(r'id="status">([^<]+)</span>', html)
    assert found, html[:500]
    return found.group(1)


def offered(http: httpx.Client, refund_id: str) -> set[str]:
    return set(re.findall(r'id="action-(\w+)"', http.get(f"/console/refunds/{refund_id}").text))


def listed(http: httpx.Client, **params: str) -> list[str]:
    """The refund ids the table of refunds links to, in order (the cards waiting for approval left out)."""
    table = http.get("/console", params=params).text.split('<table id="refunds">')[1]
    return re.findall(r'<a href="/console/refunds/([^"]+)">', table)


def audit_rows(http: httpx.Client, **params: str) -> list[tuple[int, str]]:
    """(seq, event) of the audit page's rows."""
    html = http.get("/console/audit", params=params).text
    rows = re.findall(r'<tr data-seq="(\d+)">\s*<td>\d+</td>\s*<td>[^<]*</td>\s*<td[^>]*>([^<]*)</td>', html)
    return [(int(seq), event) for seq, event in rows]


def entries_of(refund_id: str) -> int:
    with app_db().engine.connect() as conn:
        return len(audit.entries(conn, refund_id))


def test_each_phase_reads_in_plain_words_with_only_the_actions_that_make_sense(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    paid = submit(client, "lead-paid-0001", "ord_1001", "The mouse stopped working.")
    refused = submit(client, "lead-refused-01", "ord_1007", "The bike frame cracked.")
    expired = submit(client, "lead-expired-01", "ord_1002", "The desk arrived broken.")
    parked(client, expired)
    client.set_workflow_delay(deadline_id(expired), delay_seconds=0)  # its approval window closes now
    for refund_id, ending in ((paid, "completed"), (refused, "rejected"), (expired, "rejected")):
        assert wait_for_outcome(client, refund_id)["status"] == ending
    waiting = submit(client, "lead-parked-01", "ord_1002", "The desk arrived broken.")
    parked(client, waiting)
    [provider_refund] = env.sandbox.refunds("ch_ord_1001")
    with server.signed_in("ada") as ada:
        pages = {r: ada.get(f"/console/refunds/{r}").text for r in (paid, refused, expired, waiting)}
        phases = {r: pill(html) for r, html in pages.items()}
        assert phases == {paid: "Paid", refused: "Refused", expired: "Expired", waiting: "Waiting for a person"}
        summary = pages[waiting].split("<main>")[1].split('<details class="dbos"')[0]  # DBOS detail: one click away
        assert "Waiting for a person" in summary and not any(s in summary for s in ("SUCCESS", "DELAYED"))
        line = re.search(r'<p class="summary paid-line" id="paid">([^<]+)</p>', pages[paid])
        assert line is not None and line.group(1).startswith("Paid 42.00 USD on ")
        assert line.group(1).endswith(f" UTC \u2014 provider refund {provider_refund['id']}")
        assert 'id="paid"' not in pages[refused] + pages[expired] + pages[waiting]
        assert "expired: nobody decided before the deadline" in pages[expired]
        # Admin actions only where they make sense, and the others said in plain words.
        assert {r: offered(ada, r) for r in (paid, refused, expired, waiting)} == {
            paid: set(),
            refused: set(),
            expired: set(),
            waiting: set(),
        }
        assert "No action applies: this refund was refused, so there is nothing to pay." in pages[refused]
        assert "Stop this refund: not offered, this refund is already paid" in pages[paid]
        assert "expired unanswered" in pages[expired] and "waiting for an approver" in pages[waiting]
        assert not any(re.search(r"is (success|error|cancelled|pending)\b", html) for html in pages.values())
        token = csrf_of(ada, "/console")
        retry = form(ada, f"/console/refunds/{refused}/fork", step=1, csrf=token)
        assert retry.status_code == 409 and "this refund was refused" in retry.text
        # The badge counts this refund's entries; the chain check covers every refund's.
        count = entries_of(paid)
        assert f"{count} entries for this refund" in pages[paid] and "chain verified" in pages[paid]
        with app_db().engine.connect() as conn:
            assert audit.verify(conn).entries > count
        # The list shows phases and filters by them.
        assert listed(ada, phase="paid") == [paid]
        assert listed(ada, phase="expired") == [expired]
        assert listed(ada, phase="refused") == [refused]
        assert waiting in listed(ada, phase="parked") and expired not in listed(ada, phase="parked")
        assert 'title="Nobody decided before the approval window closed' in ada.get("/console").text


def test_the_audit_log_across_refunds_filters_by_refund_actor_event_and_date(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    first = submit(client, "lead-audit-0001", "ord_1002", "The desk arrived broken.")
    request = parked(client, first)
    second = submit(client, "lead-audit-0002", "ord_1001", "The <b>mouse</b> broke.")
    assert wait_for_outcome(client, second)["status"] == "completed"
    with server.signed_in("bob") as bob:
        fields = {"amount": request["amount"], "currency": request["currency"], "csrf": csrf_of(bob, "/console")}
        assert (
            form(bob, f"/console/refunds/{first}/decision", decision="reject", confirmed="yes", **fields).status_code
            == 303
        )
    assert wait_for_outcome(client, first)["status"] == "rejected"
    today = datetime.now(UTC).date()
    with server.signed_in("vic") as vic:  # a viewer reads the log
        page = vic.get("/console/audit")
        assert page.status_code == 200 and "chain verified" in page.text
        everything = audit_rows(vic)
        assert [seq for seq, _ in everything] == sorted((seq for seq, _ in everything), reverse=True)  # newest first
        mine = audit_rows(vic, refund=first)
        assert {e for _, e in mine} >= {"request received", "approval requested", "approval decided"}
        assert len(mine) == entries_of(first) and f'href="/console/refunds/{first}"' in page.text
        decided = audit_rows(vic, actor="bob", event="approval_decided")
        assert [e for _, e in decided] == ["approval decided"] and audit_rows(vic, actor="operator:bob")
        assert {e for _, e in audit_rows(vic, actor="bob")} == {"approval decided", "console signed in"}
        assert audit_rows(vic, actor="b%") == [] and audit_rows(vic, actor="operator:vic") == []
        asked = audit_rows(vic, actor="helpdesk", event="request_received")
        assert len(asked) == 2  # both refunds, asked for by client:helpdesk
        assert audit_rows(vic, since=str(today), until=str(today)) == everything
        assert audit_rows(vic, until=str(today - timedelta(days=1))) == []
        assert audit_rows(vic, since=str(today + timedelta(days=1))) == []
        echoed = vic.get("/console/audit", params={"actor": '"><script>x</script>'}).text
        assert "<script>x" not in echoed and "&lt;script&gt;x" in echoed


def test_the_console_reports_the_chain_broken_when_its_newest_entries_are_deleted(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    """The console's badge is ``refund-agent audit verify``'s check, anchor included: entries cut from the end
    of the log, which leave every MAC and link intact, turn "chain verified" into "chain broken"."""
    server, client = console
    paid = submit(client, "lead-cut-00001", "ord_1001", "The mouse broke.")
    assert wait_for_outcome(client, paid)["status"] == "completed"
    with server.signed_in("vic") as vic:
        assert "chain verified" in vic.get(f"/console/refunds/{paid}").text
        with app_db().engine.begin() as conn:
            last = conn.execute(sa.select(sa.func.max(audit_log.c.seq)).where(audit_log.c.refund_id == paid))
            conn.execute(audit_log.delete().where(audit_log.c.seq >= last.scalar_one()))  # refund_paid and after
        with app_db().engine.connect() as conn:
            report = audit.verify(conn)
        assert not report.ok and "the newest deleted?" in report.problem
        for page in (vic.get(f"/console/refunds/{paid}").text, vic.get("/console/audit").text):
            assert "chain verified" not in page and "chain broken" in page and "the newest deleted?" in page


def test_audit_search_pages_and_filters_real_rows(env: Env, console: tuple[ConsoleServer, DBOSClient]) -> None:
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        for n in range(7):
            payload = {"operator": f"operator:op{n % 2}", "note": "100% _sure_"}
            audit.append(conn, refund_id=f"r-{n % 3}", event=f"test_{n % 2}", payload=payload, now=now)
    with app_db().engine.connect() as conn:
        total = int(conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one())
        pages = [audit.search(conn, audit.AuditFilter(), offset=o, limit=3) for o in range(0, total, 3)]
        seqs = [e.seq for page in pages for e in page]
        assert seqs == list(range(total, 0, -1))  # every entry once, newest first, across pages
        by_actor = audit.search(conn, audit.AuditFilter(actor="op1"))
        assert len(by_actor) == 3 and {e.payload["operator"] for e in by_actor} == {"operator:op1"}
        both = audit.search(conn, audit.AuditFilter(refund_id="r-0", event="test_0"))
        assert {(e.refund_id, e.event) for e in both} == {("r-0", "test_0")} and len(both) == 2
        assert audit.search(conn, audit.AuditFilter(actor="%")) == []
        assert audit.search(conn, audit.AuditFilter(until=now - timedelta(seconds=1), event="test_0")) == []
        assert len(audit.search(conn, audit.AuditFilter(since=now - timedelta(seconds=1), event="test_0"))) == 4
        assert {"test_0", "test_1"} <= set(audit.event_names(conn))


def test_console_errors_are_pages_in_its_layout_and_the_api_keeps_problem_json(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with server.signed_in("vic") as vic:
        for path, status in (
            ("/console/no-such-page", 404),
            ("/console/refunds/lead-err-01/cancel", 405),
            ("/console?page=0", 422),
        ):
            page = vic.get(path)
            assert page.status_code == status and page.headers["content-type"].startswith("text/html"), path
            assert f'id="error-status">{status}<' in page.text and 'href="/console" id="back"' in page.text
            assert "vic (viewer)" in page.text  # the console's header: who is signed in
        missing = vic.get("/console/refunds/no-such-refund")
        assert missing.status_code == 404 and "There is no refund no-such-refund" in missing.text
        refused = vic.get("/console/sessions")
        assert refused.status_code == 403 and refused.headers["content-type"].startswith("text/html")
    api = web.get(f"{server.base_url}/refunds/no-such-refund", headers={"Authorization": "Bearer x"})
    assert api.headers["content-type"] == "application/problem+json"
    unknown = web.get(f"{server.base_url}/no-such-api")
    assert unknown.status_code == 404 and unknown.headers["content-type"] == "application/problem+json"


def test_a_crash_in_a_console_page_is_a_500_page_and_in_the_api_a_problem() -> None:
    app = FastAPI()
    problems.install(app)
    install_error_pages(app)
    app.state.console = ConsoleState({}, b"k" * 32, secure_cookie=False)

    @app.get("/console/boom")
    @app.get("/api/boom")
    def boom() -> None:
        raise RuntimeError("secret detail")

    with TestClient(app, raise_server_exceptions=False) as http:
        page = http.get("/console/boom")
        assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
        assert "Something went wrong" in page.text and "secret detail" not in page.text
        api = http.get("/api/boom")
        assert api.status_code == 500 and api.headers["content-type"] == "application/problem+json"
