"""The operator console over HTTP: sign-in, sessions, CSRF, roles, and admin actions on real workflows."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from markupsafe import escape
from pydantic import ValidationError

from agent import status
from agent.approvals import settle_id
from agent.console import auth
from agent.http.server import create_app
from agent.ops.processes import wait_for
from agent.settings import Settings
from agent.status import refund_status, wait_for_outcome
from steps import audit
from steps.store import app_db, approval_decisions, audit_log, outbox, refunds
from tests import web, zygote
from tests.conftest import Env
from tests.console_server import PASSWORDS, ConsoleServer, console_server, csrf_of, form
from tests.identities import link_token
from tests.servers import ThreadedServer, bound_socket
from tests.test_workflow import parked, submit


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def decisions() -> int:
    with app_db().engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(approval_decisions)).scalar_one())


def test_password_hashes_are_salted_and_checked() -> None:
    first, second = auth.hash_password("correct horse"), auth.hash_password("correct horse")
    assert first != second and first.startswith("scrypt$")
    assert auth.check_password("correct horse", first) and auth.check_password("correct horse", second)
    assert not auth.check_password("correct horsE", first)
    assert not auth.check_password("correct horse", "scrypt$1$2$3$not-base64$x")


def test_sign_in_form_cookies_are_signed_and_expire() -> None:
    session = auth.new_form_session(now=1_000_000)
    cookie = auth.encode_form_session(session, b"secret")
    assert auth.decode_form_session(cookie, b"secret", now=1_000_001) == session
    assert auth.decode_form_session(cookie, b"other secret", now=1_000_001) is None
    signature = cookie.rpartition(".")[2]
    longer = auth.encode_form_session(auth.Session(session.csrf, session.expires + 10**6), b"x")
    assert auth.decode_form_session(longer.rpartition(".")[0] + "." + signature, b"secret", now=1_000_001) is None
    assert auth.decode_form_session(cookie, b"secret", now=session.expires + 1) is None
    assert session.operator is None and not session.may("viewer")  # it grants nothing


def test_console_pages_need_a_signed_in_operator(env: Env, console: tuple[ConsoleServer, DBOSClient]) -> None:
    server, _ = console
    with web.client(base_url=server.base_url) as http:
        home = http.get("/console")
        assert home.status_code == 303 and home.headers["location"].startswith("/console/login?next=")
        detail = http.get("/console/refunds/anything")
        assert detail.status_code == 303
        login = http.get("/console/login")
        assert login.status_code == 200 and "script-src" not in login.headers["content-security-policy"]
        assert "REFUND_AGENT_OPERATORS" in login.text and "console_admin_password" not in login.text  # configured
        assert "default-src 'none'" in login.headers["content-security-policy"]
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/console" in cookie


def test_form_posts_without_the_csrf_token_or_the_session_are_refused(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "console-csrf-01", "ord_1002")
    request = parked(client, refund_id)
    fields = {"decision": "approve", "amount": request["amount"], "currency": request["currency"], "confirmed": "yes"}
    path = f"/console/refunds/{refund_id}/decision"
    with server.signed_in("bob") as bob, web.client(base_url=server.base_url) as stranger:
        token = csrf_of(bob, "/console")
        assert form(bob, path, **fields).status_code == 403  # no token
        assert form(bob, path, **fields, csrf="forged-token").status_code == 403  # wrong token
        assert form(stranger, path, **fields, csrf=token).status_code == 403  # the token without the session
        anonymous_token = csrf_of(stranger)
        assert form(stranger, path, **fields, csrf=anonymous_token).status_code == 403  # a session, not signed in
        assert form(stranger, "/console/login", name="bob", password=PASSWORDS["bob"]).status_code == 403
        assert form(bob, "/console/logout", csrf="wrong").status_code == 403
        # An approver may decide but not run admin actions.
        assert form(bob, f"/console/refunds/{refund_id}/cancel", csrf=token).status_code == 403
        assert bob.get(f"/console/refunds/{refund_id}/confirm?action=cancel").status_code == 403
        assert decisions() == 0 and status.parked(client, refund_id) is not None  # still waiting, untouched
        done = form(bob, path, **fields, csrf=token)
        assert done.status_code == 303 and done.headers["location"].endswith("?done=approve")
    assert wait_for_outcome(client, refund_id)["status"] == "completed"
    with app_db().engine.connect() as conn:
        approver = conn.execute(sa.select(approval_decisions.c.approver)).scalar_one()
    assert approver == "operator:bob"


def test_a_decision_is_bound_to_the_amount_shown_and_the_first_one_stands(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "console-bound-01", "ord_1002")
    parked(client, refund_id)
    path = f"/console/refunds/{refund_id}/decision"
    with server.signed_in("bob") as bob:
        token = csrf_of(bob, "/console")
        shown = {"amount": "1.00", "asked": "1.00", "currency": "USD", "csrf": token, "confirmed": "yes"}
        stale = form(bob, path, decision="approve", **shown)  # a page that showed another amount asked
        assert stale.status_code == 409 and "awaits 4,200.00 USD" in stale.text
        assert decisions() == 0
        fields = {"amount": "4200.00", "currency": "USD", "csrf": token, "confirmed": "yes"}
        rejected = form(bob, path, decision="reject", **fields)
        assert rejected.status_code == 303
        late = form(bob, path, decision="approve", **fields)
        assert late.status_code == 409 and "already decided: reject by operator:bob" in late.text
    assert wait_for_outcome(client, refund_id)["status"] == "rejected"
    assert decisions() == 1 and env.sandbox.refunds() == []


def decision_buttons(html: str) -> set[str]:
    return set(re.findall(r'name="decision" value="(\w+)"', html))


def test_a_refund_already_decided_offers_no_decision_and_refuses_one(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "console-decided-01", "ord_1002")
    request = parked(client, refund_id)
    fields = {"amount": request["amount"], "currency": request["currency"], "confirmed": "yes"}
    page = f"/console/refunds/{refund_id}"
    with server.signed_in("bob") as bob:
        token = csrf_of(bob, "/console")
        assert decision_buttons(bob.get(page).text) == {"approve", "reject"}
        assert decision_buttons(bob.get("/console").text) == {"approve", "reject"}  # its card on the list
        assert form(bob, f"{page}/decision", decision="reject", csrf=token, **fields).status_code == 303
        decided = bob.get(page)
        assert "reject by " in decided.text and decision_buttons(decided.text) == set()
        home = bob.get("/console")
        assert f'data-refund="{refund_id}"' not in home.text and decision_buttons(home.text) == set()
        for decision in ("approve", "reject"):  # the other way, and the same way again (a second click)
            again = form(bob, f"{page}/decision", decision=decision, csrf=token, **fields)
            assert again.status_code == 409 and "already decided: reject" in again.text
    assert wait_for_outcome(client, refund_id)["status"] == "rejected"
    assert decisions() == 1 and env.sandbox.refunds() == []


def test_a_viewer_reads_the_console_but_sees_no_decision_buttons_and_cannot_decide(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "console-viewer-01", "ord_1002")
    request = parked(client, refund_id)
    fields = {"amount": request["amount"], "currency": request["currency"]}
    with server.signed_in("vic") as vic:
        token = csrf_of(vic, "/console")
        home = vic.get("/console")
        assert home.status_code == 200 and f'data-refund="{refund_id}"' in home.text and "vic (viewer)" in home.text
        assert decision_buttons(home.text) == set()
        page = vic.get(f"/console/refunds/{refund_id}")
        assert page.status_code == 200 and decision_buttons(page.text) == set() and "admin-actions" not in page.text
        for decision in ("approve", "reject"):
            refused = form(vic, f"/console/refunds/{refund_id}/decision", decision=decision, csrf=token, **fields)
            assert refused.status_code == 403 and "needs the approver role" in refused.text
        assert form(vic, f"/console/refunds/{refund_id}/cancel", csrf=token).status_code == 403
        assert vic.get("/console/sessions").status_code == 403
    assert decisions() == 0 and status.parked(client, refund_id) is not None


def test_a_refunds_messages_and_every_failed_one_show_their_delivery_and_never_their_text(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "console-mail-01", "ord_1002")
    parked(client, refund_id)
    engine = app_db().engine
    with engine.begin() as conn:
        queued = conn.execute(sa.select(outbox).where(outbox.c.refund_id == refund_id).order_by(outbox.c.id)).all()
        failing = queued[0]
        error = "SMTPRecipientsRefused: 550 mailbox unavailable"
        conn.execute(
            outbox.update()
            .where(outbox.c.id == failing.id)
            .values(delivery_state="failed", attempts=5, last_error=error)
        )
    tokens = [token for name in PASSWORDS if (token := link_token(engine, refund_id, name)) is not None]
    assert queued and tokens, "the approvers' notices, each with its signed link"
    with server.signed_in("vic") as vic:  # a viewer: sees where messages went, never a link to decide with
        page = vic.get(f"/console/refunds/{refund_id}").text
        home = vic.get("/console").text
    shown = page[page.index('id="deliveries"') :]
    assert shown.count('class="delivery ') == len(queued)
    assert f"approver {failing.recipient}" in shown and error in shown and 'class="delivery failed"' in shown
    banner = home[home.index('id="failed-deliveries"') :]
    assert "Messages not delivered (1)" in banner and refund_id in banner and error in banner
    for text in (page, home):
        assert not any(token in text for token in tokens)
        assert not any(row.body in text for row in queued if row.channel == "approvers")


def test_a_refunds_conversation_shows_the_customers_words_escaped_and_what_they_were_told(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    words = "Please refund me <b>now</b> <script>alert('x')</script>"  # no digits: the offline model reads them
    refund_id = submit(client, "console-talk-01", "ord_1002", words)
    parked(client, refund_id)
    with app_db().engine.connect() as conn:
        told = conn.execute(sa.select(outbox.c.body).where(outbox.c.message_key == f"{refund_id}:customer:waiting"))
        waiting = told.scalar_one()
        to_approvers = conn.execute(
            sa.select(outbox.c.body).where(outbox.c.refund_id == refund_id, outbox.c.channel == "approvers")
        ).scalars()
        approvers = list(to_approvers)
    with server.signed_in("vic") as vic:
        page = vic.get(f"/console/refunds/{refund_id}").text
    talk = page[page.index('id="conversation"') : page.index('id="deliveries"')]
    assert escape(words) in talk and "<script>alert" not in page
    assert escape(waiting) in talk and "waiting for a person" in talk
    assert talk.index('class="turn customer"') < talk.index('class="turn agent"')
    assert approvers and not any(escape(body) in talk for body in approvers)


def test_admin_actions_without_their_csrf_token_are_refused_and_change_nothing(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    env.sandbox.set_faults(latency_ms=3000)  # the refund is cancelled during its payment call
    refund_id = submit(client, "console-csrf-admin-01", "ord_1001", "The mouse is broken.")
    without_token: list[dict[str, Any]] = [{}, {"csrf": "forged-token"}]
    with server.signed_in("ada") as ada, server.signed_in("bob") as bob:
        token = csrf_of(ada, "/console")
        wait_for(lambda: _row_status(refund_id) == "paying", timeout=60, what="the payment call")
        cancel = f"/console/refunds/{refund_id}/cancel"
        for fields in [*without_token, {"csrf": csrf_of(bob, "/console")}]:  # none, forged, another session's
            assert form(ada, cancel, **fields).status_code == 403
        assert client.retrieve_workflow(refund_id).get_status().status != "CANCELLED"
        assert _operator_events(refund_id) == [] and _row_status(refund_id) == "paying"
        assert form(ada, cancel, csrf=token).status_code == 303  # the token makes it work: the test can fail
        runs = len(client.list_workflows(load_input=False, load_output=False))
        for action, extra in (("resume", {}), ("fork", {"step": 1})):
            for fields in without_token:
                assert form(ada, f"/console/refunds/{refund_id}/{action}", **extra, **fields).status_code == 403
        assert client.retrieve_workflow(refund_id).get_status().status == "CANCELLED"
        assert len(client.list_workflows(load_input=False, load_output=False)) == runs  # no fork, no resume
        assert _operator_events(refund_id) == ["operator_cancelled"] and _row_status(refund_id) == "cancelled"
    env.sandbox.set_faults(latency_ms=0)


def _operator_events(refund_id: str) -> list[str]:
    with app_db().engine.connect() as conn:
        return [e.event for e in audit.entries(conn, refund_id) if e.event.startswith("operator_")]


def test_wrong_passwords_are_refused_and_sign_in_is_rate_limited(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with web.client(base_url=server.base_url) as http:
        token = csrf_of(http)
        for _ in range(5):
            wrong = form(http, "/console/login", name="ada", password="guess", csrf=token)
            assert wrong.status_code == 401 and "Wrong name or password" in wrong.text
        unknown = form(http, "/console/login", name="nobody", password="guess", csrf=token)
        assert unknown.status_code == 401
        blocked = form(http, "/console/login", name="ada", password=PASSWORDS["ada"], csrf=token)
        assert blocked.status_code == 429 and "Too many attempts" in blocked.text
        assert int(blocked.headers["retry-after"]) >= 1
    with server.signed_in("bob") as bob:  # another operator is not locked out by ada's failures
        assert bob.get("/console").status_code == 200


def test_admin_cancels_and_resumes_a_running_refund_and_a_parked_one_is_not_cancellable(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    waiting = submit(client, "console-admin-00", "ord_1002")
    parked(client, waiting)
    env.sandbox.set_faults(latency_ms=3000)  # the refund below is cancelled during its payment call
    refund_id = submit(client, "console-admin-01", "ord_1001", "The mouse is broken.")
    with server.signed_in("ada") as ada:
        token = csrf_of(ada, "/console")
        assert offered(ada, waiting) == set()  # parked: nothing runs to stop, resume or retry
        refused = form(ada, f"/console/refunds/{waiting}/cancel", csrf=token)
        assert refused.status_code == 409 and "waiting for an approver" in refused.text
        wait_for(lambda: _row_status(refund_id) == "paying", timeout=60, what="the payment call")
        assert offered(ada, refund_id) == {"cancel"}
        not_now = ada.get(f"/console/refunds/{refund_id}/confirm", params={"action": "resume"})
        assert 'id="refused"' in not_now.text and "Yes, resume" not in not_now.text
        running = form(ada, f"/console/refunds/{refund_id}/resume", csrf=token)
        assert running.status_code == 409 and "only a stopped or stuck refund" in running.text
        confirm = ada.get(f"/console/refunds/{refund_id}/confirm", params={"action": "cancel"})
        assert confirm.status_code == 200 and "Yes, stop this refund" in confirm.text
        assert form(ada, f"/console/refunds/{refund_id}/cancel", csrf=token).status_code == 303
        assert client.retrieve_workflow(refund_id).get_status().status == "CANCELLED"
        assert offered(ada, refund_id) == {"resume", "fork"}
        assert form(ada, f"/console/refunds/{refund_id}/cancel", csrf=token).status_code == 409

        def listed(**filters: str) -> bool:
            page = ada.get("/console", params=filters)
            return f'href="/console/refunds/{refund_id}"' in page.text

        yesterday, before = (datetime.now(UTC).date() - timedelta(days=n) for n in (1, 2))
        assert listed(phase="cancelled") and not listed(phase="paid")
        assert listed(order="ord_1001", since=str(yesterday)) and not listed(order="ord_1002")
        assert not listed(until=str(before))
        env.sandbox.set_faults(latency_ms=0)
        assert form(ada, f"/console/refunds/{refund_id}/resume", csrf=token).status_code == 303
        assert wait_for_outcome(client, refund_id)["status"] == "completed"
        assert offered(ada, refund_id) == set()  # paid: a fork would only replay the payment
        assert "this refund is already paid (provider refund" in ada.get(f"/console/refunds/{refund_id}").text
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1
    assert status.parked(client, waiting) is not None  # the parked refund was left as it was
    with app_db().engine.connect() as conn:
        events = [e.event for e in audit.entries(conn, refund_id)]
        assert audit.verify(conn).ok
        payloads = conn.execute(sa.select(audit_log.c.payload).where(audit_log.c.event.like("operator_%"))).scalars()
        assert all('"operator": "operator:ada"' in p for p in payloads)
    assert events.count("operator_cancelled") == 1 and events.count("operator_resumed") == 1


def offered(http: httpx.Client, refund_id: str) -> set[str]:
    """The admin actions the refund's page offers."""
    return set(re.findall(r'id="action-(\w+)"', http.get(f"/console/refunds/{refund_id}").text))


def _row_status(refund_id: str) -> str | None:
    with app_db().engine.connect() as conn:
        return conn.execute(sa.select(refunds.c.status).where(refunds.c.refund_id == refund_id)).scalar()


def test_a_fork_from_the_payment_step_reuses_the_key_and_pays_once(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    """Cancelled while the provider is applying the refund, then forked: the provider replays, nobody is paid twice."""
    server, client = console
    refund_id = submit(client, "console-fork-01", "ord_1002")
    request = parked(client, refund_id)
    env.sandbox.set_faults(latency_ms=3000)
    with server.signed_in("ada") as ada:
        token = csrf_of(ada, "/console")
        fields = {"decision": "approve", "amount": request["amount"], "currency": "USD", "confirmed": "yes"}
        assert form(ada, f"/console/refunds/{refund_id}/decision", **fields, csrf=token).status_code == 303

        def paying() -> int | None:
            steps = {s["function_name"]: s for s in client.list_workflow_steps(settle_id(refund_id))}
            prepared = steps.get("refunds.prepare_approved_payment")
            return prepared["function_id"] if prepared and prepared["completed_at_epoch_ms"] else None

        prepare_step = wait_for(paying, timeout=60, what="the payment step to start", interval=0.05)
        assert form(ada, f"/console/refunds/{refund_id}/cancel", csrf=token).status_code == 303
        wait_for(lambda: len(env.sandbox.refunds("ch_ord_1002")) == 1, timeout=30, what="the provider to apply it")
        env.sandbox.set_faults(latency_ms=0)
        page = ada.get(f"/console/refunds/{refund_id}/confirm", params={"action": "fork"})
        assert "A fork reuses the same payment idempotency key" in page.text
        assert f"refund:{refund_id}:ord_1002" in page.text
        forked = form(ada, f"/console/refunds/{refund_id}/fork", step=prepare_step, csrf=token)
        assert forked.status_code == 303 and "fork=" in forked.headers["location"]
        fork_id = forked.headers["location"].split("fork=")[1]
        status = refund_status(client, refund_id)
        assert status is not None and status["status"] == "paying"  # where it stood, not "cancelled"
        outcome: dict[str, Any] = wait_for_outcome(client, refund_id)
        assert client.retrieve_workflow(fork_id).get_status().status == "SUCCESS"
        assert outcome["status"] == "completed" and outcome["idempotency_key"] == f"refund:{refund_id}:ord_1002"
        detail = ada.get(f"/console/refunds/{refund_id}")
        assert fork_id in detail.text and "chain verified" in detail.text
        assert '<span class="pill paid" id="status">Paid</span>' in detail.text  # the fork's outcome
        again = form(ada, f"/console/refunds/{refund_id}/fork", step=prepare_step, csrf=token)
        assert again.status_code == 409 and "already paid" in again.text
    refunds = env.sandbox.refunds("ch_ord_1002")
    assert len(refunds) == 1 and refunds[0]["id"] == outcome["provider_refund_id"]
    with app_db().engine.connect() as conn:
        paid = [e.payload for e in audit.entries(conn, refund_id) if e.event == "refund_paid"]
    assert len(paid) == 1 and paid[0]["replayed"] is True


def test_without_operators_serve_makes_an_admin_whose_password_is_in_a_private_file(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    settings = env.settings(refund_agent_port=port)
    server = ThreadedServer(create_app(settings, freeze_heap=False), sock=sock)
    with caplog.at_level(logging.WARNING):
        server.start()
    try:
        path = settings.console_admin_password_file()
        assert path.stat().st_mode & 0o777 == 0o600
        password = path.read_text().strip()
        assert str(path) in caplog.text and password not in caplog.text
        with web.client(base_url=server.base_url) as http:
            hint = http.get("/console/login").text  # the sign-in page says how to get in the first time
            assert "sign in as <b>admin</b>" in hint and "console_admin_password" in hint and password not in hint
            fields = {"name": "admin", "password": password, "csrf": csrf_of(http), "next": "/console"}
            assert http.post("/console/login", data=fields).status_code == 303
            assert "admin (admin)" in http.get("/console").text
    finally:
        server.stop()


def test_hash_password_prints_a_hash_the_settings_accept(tmp_path: Path) -> None:
    done = zygote.run(["hash-password"], env=dict(os.environ), input="a long passphrase\n", timeout=60)
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip()
    assert hashed.startswith("scrypt$") and "passphrase" not in done.stdout
    settings = Settings(refund_agent_data_dir=tmp_path, refund_agent_operators={"dana": f"approver:{hashed}"})
    operator = auth.authenticate(auth.parse_operators(settings.approvals.operators), "dana", "a long passphrase")
    assert operator is not None and operator.role == "approver"
    with pytest.raises(ValidationError):
        Settings(refund_agent_data_dir=tmp_path, refund_agent_operators={"dana": "root:plain-text-password"})
