"""Console sign-in through a real OpenID provider (``tests/oidc``, the ``oidc-provider`` package under node):
the code flow with PKCE, the role from the groups claim, sign-out at both ends, and a clear page for every
bad input (wrong state, replayed code, nonce mismatch, unknown issuer, provider down, no mapped role)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import httpx
import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, expect
from pydantic import ValidationError

from agent.console import auth
from agent.console.oidc import operator_name, role_for
from agent.identity import Role
from agent.ops.processes import free_port
from agent.settings import Settings
from steps import audit
from steps.store import app_db, approval_decisions
from steps.store import console_sessions as session_rows
from tests import web
from tests.conftest import Env
from tests.console_server import console_server, csrf_of, form
from tests.oidc_provider import ROLE_GROUPS, SUBJECTS, OidcProvider, node
from tests.servers import reserve_port
from tests.test_console_browser import browser  # noqa: F401 (the fixture: Debian's Chromium, headless)
from tests.test_workflow import parked, submit

pytestmark = pytest.mark.skipif(node() is None, reason="node is not installed: the test OpenID provider needs it")
#: The console's port, held by this worker from collection on: the provider knows it, and consoles come and go on it.
CONSOLE_SOCKET = reserve_port()
CONSOLE_URL = f"http://127.0.0.1:{CONSOLE_SOCKET.getsockname()[1]}"
CALLBACK = f"{CONSOLE_URL}/console/auth/callback"


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    running = OidcProvider(CONSOLE_URL)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def console(env: Env, **settings: Any) -> Iterator[httpx.Client]:
    """The console on the port the provider knows, and an HTTP client for it."""
    with (
        console_server(env, reserved=CONSOLE_SOCKET, **settings) as (server, _),
        web.client(base_url=server.base_url, timeout=30) as http,
    ):
        yield http


def through_provider(http: httpx.Client, login: str, tamper: Callable[[str], str] | None = None) -> str:
    """Start a sign-in at the console, sign in at the provider's login page (unless the provider's session
    still signs the browser in); the callback URL the provider sends the browser back to."""
    started = http.get("/console/auth/start")
    assert started.status_code == 303, started.text
    url = str(started.headers["location"])
    back = _to_callback(http, http.get(tamper(url) if tamper else url))
    if isinstance(back, str):
        return back
    action = re.search(r'<form[^>]*action="([^"]*/interaction/[^"]*)"', back.text)
    assert action, back.text
    fields = {"prompt": "login", "login": SUBJECTS[login], "password": "any"}  # the login page takes any password
    back = _to_callback(http, http.post(urljoin(str(back.url), action.group(1)), data=fields))
    assert isinstance(back, str), back.text
    return back


def _to_callback(http: httpx.Client, response: httpx.Response) -> str | httpx.Response:
    """Follow the provider's redirects up to the console's callback (its URL) or a page (the response)."""
    for _ in range(10):
        location = str(response.headers.get("location", ""))
        if location.startswith(CALLBACK):
            return location
        if response.status_code not in (302, 303):
            return response
        response = http.get(urljoin(str(response.url), location))
    raise AssertionError("the provider kept redirecting")


def service_entries(event: str) -> list[dict[str, Any]]:
    with app_db().engine.connect() as conn:
        return [e.payload for e in audit.entries(conn, "") if e.event == event]


def no_trace(response: httpx.Response) -> None:
    assert "Traceback" not in response.text and "Internal Server Error" not in response.text
    assert response.headers["content-type"].startswith("text/html")


def test_an_approver_signs_in_through_the_provider_with_the_role_its_groups_give(
    env: Env, provider: OidcProvider
) -> None:
    with console(env, **provider.settings()) as http:
        assert "Sign in with the company" in http.get("/console/login").text
        landed = http.get(through_provider(http, "bob"))
        assert landed.status_code == 303 and landed.headers["location"] == "/console"
        assert http.get("/console").status_code == 200
        with app_db().engine.connect() as conn:
            rows = conn.execute(sa.select(session_rows)).all()
        assert [(r.operator, r.role) for r in rows] == [(f"oidc.{SUBJECTS['bob']}", "approver")]
        signed_in = service_entries("console_signed_in")[-1]
        assert signed_in["subject"] == SUBJECTS["bob"] and signed_in["email"] == "bob@example.com"
        assert signed_in["role"] == "approver" and "refund-approvers" in signed_in["groups"]
        # An admin's sessions page keeps it (backed by the provider's configuration, not deleted as unknown).
        with web.client(base_url=str(http.base_url), timeout=30) as admin:
            assert admin.get(through_provider(admin, "ada")).status_code == 303
            listed = admin.get("/console/sessions")
            assert listed.status_code == 200 and f"oidc.{SUBJECTS['bob']}" in listed.text
        out = form(http, "/console/logout", csrf=csrf_of(http, "/console"))
        assert out.status_code == 303
        assert out.headers["location"].startswith(f"{provider.issuer}/session/end?")
        assert "id_token_hint=" in out.headers["location"]
        with app_db().engine.connect() as conn:  # bob's row is gone; ada's stays
            assert [r.operator for r in conn.execute(sa.select(session_rows))] == [f"oidc.{SUBJECTS['ada']}"]
        assert service_entries("console_signed_out")[-1]["operator"] == f"oidc.{SUBJECTS['bob']}"


def test_bad_callbacks_get_a_clear_page(env: Env, provider: OidcProvider) -> None:
    with console(env, **provider.settings()) as http:
        # Wrong state: the callback does not belong to the flow this browser started.
        callback = through_provider(http, "bob")
        wrong = re.sub(r"state=[^&]+", "state=forged", callback)
        refused = http.get(wrong)
        assert refused.status_code == 400 and "Sign-in not recognised" in refused.text
        no_trace(refused)
        # No flow at all (another browser's callback, or after 10 minutes).
        http.cookies.clear()
        refused = http.get(callback)
        assert refused.status_code == 400 and "not started in this browser" in refused.text

        # A code used twice: the second use is refused by the provider, and here with a page.
        callback = through_provider(http, "bob")
        flow = http.cookies.get("refund_console_oidc_flow")
        assert http.get(callback).status_code == 303
        http.cookies.set("refund_console_oidc_flow", str(flow), path="/console/auth")
        replayed = http.get(callback)
        assert replayed.status_code == 400 and "expired or was already used" in replayed.text
        no_trace(replayed)

        # A nonce other than the one this browser's flow holds.
        def other_nonce(url: str) -> str:
            parts = urlsplit(url)
            query = dict(parse_qsl(parts.query)) | {"nonce": "someone-elses-nonce"}
            return urlunsplit(parts._replace(query=urlencode(query)))

        http.cookies.clear()
        refused = http.get(through_provider(http, "bob", tamper=other_nonce))
        assert refused.status_code == 400 and "ID token did not check out" in refused.text
        no_trace(refused)

        # Signed in at the provider, but in no group the console maps.
        http.cookies.clear()
        refused = http.get(through_provider(http, "nina"))
        assert refused.status_code == 403 and "none of your groups gives a role" in refused.text
        no_trace(refused)
        with app_db().engine.connect() as conn:  # only the code's first use started a session
            assert [r.operator for r in conn.execute(sa.select(session_rows))] == [f"oidc.{SUBJECTS['bob']}"]
        reasons = [e["reason"] for e in service_entries("console_sign_in_failed")]
        assert reasons == [
            "Sign-in not recognised",
            "Sign-in not recognised",
            "Sign-in expired",
            "Sign-in not accepted",
            "No console role",
        ]


def test_an_unknown_issuer_or_a_provider_that_is_down_gets_a_page_and_passwords_can_be_off(
    env: Env, provider: OidcProvider
) -> None:
    # The provider answers at localhost, but calls itself 127.0.0.1: not the issuer configured.
    elsewhere = provider.settings(oidc_issuer_url=f"http://localhost:{provider.port}")
    with console(env, **elsewhere) as http:
        refused = http.get("/console/auth/start")
        assert refused.status_code == 502 and "Unknown sign-in provider" in refused.text
        no_trace(refused)
    down = provider.settings(oidc_issuer_url=f"http://127.0.0.1:{free_port()}", console_password_sign_in=False)
    with console(env, **down) as http:
        refused = http.get("/console/auth/start")
        assert refused.status_code == 503 and "cannot be reached" in refused.text
        no_trace(refused)
        page = http.get("/console/login")
        assert 'name="password"' not in page.text
        tried = form(http, "/console/login", name="ada", password="whatever", csrf="none")
        assert tried.status_code == 403 and "Password sign-in is off" in tried.text


def test_the_settings_refuse_half_an_oidc_configuration_and_passwords_off_without_it(env: Env) -> None:
    issuer = {"oidc_issuer_url": "https://id.example.com", "oidc_client_id": "console"}
    with pytest.raises(ValidationError, match="together"):
        env.settings(**issuer)
    with pytest.raises(ValidationError, match="blank") as blank:
        env.settings(**issuer, oidc_client_secret=" \t ")
    assert "\\t" not in str(blank.value) and "\t" not in str(blank.value)  # the value is not repeated
    with pytest.raises(ValidationError, match="CONSOLE_PASSWORD_SIGN_IN"):
        env.settings(console_password_sign_in=False)
    with pytest.raises(ValidationError, match="oidc"):
        env.settings(refund_agent_operators={"oidc.eve": "admin:scrypt$x"})
    assert isinstance(env.settings(**issuer, oidc_client_secret="s3cret"), Settings)


def test_an_approver_signs_in_at_the_providers_page_approves_a_refund_and_signs_out_of_both(
    env: Env,
    provider: OidcProvider,
    browser: Browser,  # noqa: F811 (the fixture imported above)
) -> None:
    settings = provider.settings()
    with console_server(env, reserved=CONSOLE_SOCKET, **settings) as (server, client):
        refund_id = submit(client, "oidc-browser-approve-01", "ord_1002", "The standing desk arrived broken.")
        parked(client, refund_id)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(f"{server.base_url}/console")
        page.get_by_role("link", name="Sign in with the company's identity provider").click()
        expect(page).to_have_url(re.compile(re.escape(provider.issuer) + "/interaction/"))
        page.locator('input[name="login"]').fill(SUBJECTS["bob"])
        page.locator('input[name="password"]').fill("any")
        page.locator('button[type="submit"]').first.click()
        expect(page).to_have_url(f"{server.base_url}/console")

        card = page.locator(f'section.pending[data-refund="{refund_id}"]')
        card.get_by_role("button", name="Approve").click()
        expect(page.locator("#confirm-question")).to_contain_text(f"Approve 4,200.00 USD for refund {refund_id}?")
        page.get_by_role("button", name="Confirm").click()
        expect(page).to_have_url(f"{server.base_url}/console/refunds/{refund_id}?done=approve")
        operator = f"operator:oidc.{SUBJECTS['bob']}"
        expect(page.locator("#decision")).to_contain_text(f"approve by {operator} via console")
        with app_db().engine.connect() as conn:
            assert conn.execute(sa.select(approval_decisions.c.approver)).scalar_one() == operator
        signed_in = service_entries("console_signed_in")[-1]
        assert (signed_in["operator"], signed_in["subject"], signed_in["email"], signed_in["role"]) == (
            f"oidc.{SUBJECTS['bob']}",
            SUBJECTS["bob"],
            "bob@example.com",
            "approver",
        )

        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(re.compile(re.escape(provider.issuer) + "/session/end"))
        page.get_by_role("button", name="Yes, sign me out").click()
        expect(page).to_have_url(re.compile(re.escape(f"{server.base_url}/console/login")))
        with app_db().engine.connect() as conn:
            assert conn.execute(sa.select(session_rows)).all() == []
        assert "end_session" in provider.lines  # the provider's session ended too


def test_provider_subjects_become_operator_names_that_cannot_pass_for_another() -> None:
    assert operator_name("00u1abcd@example") == "oidc.00u1abcd@example"
    hashed = operator_name("tenant:user_1")  # ':' and '_' are not a name's characters
    assert hashed.startswith("oidc.h-") and ":" not in hashed and hashed != operator_name("tenant:user_2")
    assert len(operator_name("x" * 500)) <= 100


def test_the_most_powerful_mapped_group_gives_the_role() -> None:
    mapping: dict[str, Role] = {"support": "viewer", "leads": "approver", "ops": "admin"}
    assert role_for(("support", "leads"), mapping) == "approver"
    assert role_for(("ops", "support"), mapping) == "admin"
    assert role_for(("marketing",), mapping) is None


def test_a_change_of_the_groups_to_roles_mapping_ends_the_sessions_signed_in_under_the_old_one(
    env: Env, provider: OidcProvider
) -> None:
    """bob signed in as an approver; the console restarts with the same configuration (his session stays), then
    with refund-approvers mapped to viewer: his session ends, as a changed password ends a local operator's."""
    with console(env, **provider.settings()) as http:
        assert http.get(through_provider(http, "bob")).status_code == 303
        cookie = str(http.cookies.get(auth.SESSION_COOKIE))
        assert http.get("/console").status_code == 200
    bob = f"oidc.{SUBJECTS['bob']}"

    def console_as_bob(**settings: Any) -> tuple[int, list[str], list[dict[str, Any]]]:
        """The console restarted with ``settings``: bob's page, the sessions left, the sessions ended."""
        with console(env, **provider.settings(**settings)) as again:
            again.cookies.set(auth.SESSION_COOKIE, cookie)
            page = again.get("/console").status_code
            with app_db().engine.connect() as conn:
                left = [str(r.operator) for r in conn.execute(sa.select(session_rows))]
            return page, left, service_entries("console_session_ended")

    assert console_as_bob() == (200, [bob], [])  # restarted as it was: the session stands
    demoted = {**ROLE_GROUPS, "refund-approvers": "viewer"}
    page, left, ended = console_as_bob(oidc_role_groups=demoted)
    assert (page, left) == (303, [])  # back to the sign-in page, the session gone
    assert [(e["operator"], e["reason"]) for e in ended] == [(bob, "sign-in provider or its role mapping changed")]
