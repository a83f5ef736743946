"""Console sessions on the server: sign-out, revocation and operator changes end them at once; sign-in
backs off per name without locking the right password out for good; the per-address limit counts the real
client address; sign-ins and sign-outs land in the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from pydantic import ValidationError

from agent.console import addresses, auth
from agent.ops.processes import wait_for
from agent.settings import Settings
from steps import audit, console_sessions, sign_in_throttle
from steps.migrate import upgrade
from steps.store import app_db, create_engine
from steps.store import console_sessions as session_rows
from tests import web
from tests.conftest import Env
from tests.console_server import HASHES, OPERATORS, PASSWORDS, ConsoleServer, console_server, csrf_of, form, sign_in


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def service_entries(env: Env, event: str | None = None) -> list[dict[str, Any]]:
    """The payloads of the audit log's service-wide entries about the console (not about one refund, nor the
    service's API clients), oldest first."""
    engine = env.app_engine()  # the service may have stopped (and closed its own)
    try:
        with engine.connect() as conn:
            assert audit.verify(conn).ok
            console = [e for e in audit.entries(conn, "") if e.event.startswith("console_")]
            return [e.payload | {"event": e.event} for e in console if event in (None, e.event)]
    finally:
        engine.dispose()


def signed_in(http: httpx.Client) -> bool:
    """The client's cookie still signs someone in (the console page, not the sign-in page)."""
    page = http.get("/console")
    return page.status_code == 200 and "Sign out" in page.text


def copy_of(http: httpx.Client, server: ConsoleServer) -> httpx.Client:
    """Another client holding the same session cookie, as a thief with a copied cookie would."""
    return web.client(base_url=server.base_url, cookies={auth.SESSION_COOKIE: http.cookies[auth.SESSION_COOKIE]})


def test_a_cookie_copied_before_sign_out_is_refused_after_it_and_both_land_in_the_audit_log(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with server.signed_in("ada") as ada, copy_of(ada, server) as thief:
        assert signed_in(thief)  # the copy works while the session lives
        stolen_token = csrf_of(thief, "/console")
        assert form(ada, "/console/logout", csrf=csrf_of(ada, "/console")).status_code == 303
        assert not signed_in(ada) and not signed_in(thief)
        assert form(thief, "/console/logout", csrf=stolen_token).status_code == 403
        with app_db().engine.connect() as conn:
            assert console_sessions.all_sessions(conn) == []
    entries = service_entries(env)
    assert [e["event"] for e in entries] == ["console_signed_in", "console_signed_out"]
    assert all(e["operator"] == "ada" and e["address"] == "127.0.0.1" for e in entries)
    assert entries[0]["role"] == "admin" and entries[0]["session"] == entries[1]["session"]
    assert not any(password in str(entries) for password in PASSWORDS.values())


def test_operators_removed_or_given_a_new_password_or_role_lose_their_sessions_at_once(env: Env) -> None:
    """The operators are reconfigured and the service restarted: each changed operator's cookie is refused on
    its next request; the unchanged one's session survives the restart."""
    dee_password = "dee-approver-pass"
    before = {**OPERATORS, "dee": f"approver:{auth.hash_password(dee_password)}"}
    cookies = {}
    with console_server(env, operators=before) as (server, _):
        for name in ("ada", "bob", "vic", "dee"):
            with server.signed_in(name, dee_password if name == "dee" else None) as http:
                cookies[name] = http.cookies[auth.SESSION_COOKIE]
    after = {
        "ada": OPERATORS["ada"],  # unchanged
        # bob removed
        "vic": f"approver:{HASHES['vic']}",  # a new role, the same password
        "dee": f"approver:{auth.hash_password(dee_password)}",  # the same password, hashed anew
    }
    with console_server(env, operators=after) as (server, _):
        for name, cookie in cookies.items():
            with web.client(base_url=server.base_url, cookies={auth.SESSION_COOKIE: cookie}) as http:
                assert signed_in(http) == (name == "ada"), name
        with app_db().engine.connect() as conn:
            assert [s.operator for s in console_sessions.all_sessions(conn)] == ["ada"]
        with server.signed_in("vic") as vic:  # signed in again: the new role
            assert "vic (approver)" in vic.get("/console").text
    ended = {e["operator"]: e["reason"] for e in service_entries(env, "console_session_ended")}
    assert ended == {"bob": "operator removed", "vic": "role or password changed", "dee": "role or password changed"}


def test_a_session_ends_when_idle_too_long_or_past_its_lifetime(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    """The clock is moved by moving the rows' times back: as if the session had been left that long."""
    server, _ = console
    with server.signed_in("ada") as ada, server.signed_in("bob") as bob, server.signed_in("vic") as vic:
        with app_db().engine.begin() as conn:
            rows = {s.operator: s for s in console_sessions.all_sessions(conn)}
            just_in_time = auth.SESSION_IDLE - timedelta(minutes=2)
            for name, field, back in (
                ("ada", "last_seen_at", just_in_time),
                ("bob", "last_seen_at", auth.SESSION_IDLE),
                ("vic", "expires_at", auth.SESSION_LIFETIME),  # used a moment ago, but signed in long since
            ):
                row = rows[name]
                moved = {field: getattr(row, field) - back}
                conn.execute(session_rows.update().where(session_rows.c.session_hash == row.session_hash).values(moved))
        assert signed_in(ada) and not signed_in(bob) and not signed_in(vic)
        with app_db().engine.connect() as conn:
            [left] = console_sessions.all_sessions(conn)
        assert left.operator == "ada" and left.last_seen_at > rows["ada"].last_seen_at  # used: its idle time restarts


def test_an_admin_revokes_a_session_after_confirming_and_its_cookie_stops_working(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with server.signed_in("ada") as ada, server.signed_in("bob") as bob:
        listing = ada.get("/console/sessions")
        assert (
            listing.status_code == 200 and 'data-operator="bob"' in listing.text and 'id="this-session"' in listing.text
        )
        with app_db().engine.connect() as conn:
            bobs = next(s for s in console_sessions.all_sessions(conn) if s.operator == "bob")
        confirm = ada.get(f"/console/sessions/{bobs.session_hash}/revoke")
        assert confirm.status_code == 200 and "Yes, revoke" in confirm.text and "bob" in confirm.text
        revoke = f"/console/sessions/{bobs.session_hash}/revoke"
        assert form(ada, revoke).status_code == 403 and form(ada, revoke, csrf="forged").status_code == 403
        assert form(bob, revoke, csrf=csrf_of(bob, "/console")).status_code == 403  # approvers revoke nothing
        assert bob.get("/console/sessions").status_code == 403
        assert signed_in(bob)
        done = form(ada, revoke, csrf=csrf_of(ada, "/console"))
        assert done.status_code == 303 and done.headers["location"] == "/console/sessions?done=revoked"
        assert not signed_in(bob) and signed_in(ada)
        assert 'data-operator="bob"' not in ada.get("/console/sessions").text
        assert form(ada, revoke, csrf=csrf_of(ada, "/console")).status_code == 404  # already gone
    [revoked] = service_entries(env, "console_session_revoked")
    assert revoked["operator"] == "ada" and revoked["session_operator"] == "bob" and revoked["address"] == "127.0.0.1"


def test_the_right_password_waits_out_the_backoff_and_then_signs_in(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with web.client(base_url=server.base_url, timeout=30) as http:
        typed_name = "hunter2-typed-in-the-name-field"
        assert sign_in(http, typed_name, "guess").status_code == 401
        for _ in range(auth.BACKOFF.free_failures):
            assert sign_in(http, "ada", "guess").status_code == 401
        waiting = sign_in(http, "ada", PASSWORDS["ada"])
        assert waiting.status_code == 429 and int(waiting.headers["retry-after"]) >= 1
        with server.signed_in("bob"):  # another name is not held back
            pass

        def right_password_signs_in() -> bool:
            answer = sign_in(http, "ada", PASSWORDS["ada"])
            assert answer.status_code in (303, 429), answer.text  # refused while the delay lasts, never 401
            return answer.status_code == 303

        wait_for(right_password_signs_in, timeout=60, what="the backoff to pass", interval=0.5)
        assert signed_in(http)
    failed = service_entries(env, "console_sign_in_failed")
    assert [e["operator"] for e in failed] == [None] + ["ada"] * auth.BACKOFF.free_failures
    [backoff] = service_entries(env, "console_sign_in_backoff")
    assert backoff["operator"] == "ada" and backoff["retry_after_seconds"] == auth.BACKOFF.first_delay.seconds
    assert typed_name not in str(service_entries(env))  # a name that is no operator's is not recorded
    with app_db().engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT throttle_key FROM console_sign_in_throttle")).scalars().all()
    assert not any(typed_name in key for key in keys)


def test_rotating_x_forwarded_for_from_an_untrusted_peer_does_not_dodge_the_address_limit(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    with web.client(base_url=server.base_url, timeout=30) as http:
        for n in range(auth.ADDRESS_LIMIT.failures):
            http.headers["X-Forwarded-For"] = f"203.0.113.{n}"
            assert sign_in(http, f"nobody-{n}", "guess").status_code == 401
        http.headers["X-Forwarded-For"] = "198.51.100.99"
        assert sign_in(http, "ada", PASSWORDS["ada"]).status_code == 429
    assert {e["address"] for e in service_entries(env, "console_sign_in_failed")} == {"127.0.0.1"}
    [limited] = service_entries(env, "console_sign_in_address_limited")
    assert limited["address"] == "127.0.0.1"


def test_a_trusted_proxys_x_forwarded_for_is_honoured(env: Env) -> None:
    trusted: dict[str, Any] = {"refund_agent_trusted_proxies": ["127.0.0.1"]}
    with console_server(env, **trusted) as (server, _), web.client(base_url=server.base_url, timeout=30) as http:
        for n in range(auth.ADDRESS_LIMIT.failures):  # whatever the client wrote on the left, the proxy saw .7
            http.headers["X-Forwarded-For"] = f"10.9.9.{n}, 198.51.100.7"
            assert sign_in(http, f"nobody-{n}", "guess").status_code == 401
        assert sign_in(http, "ada", PASSWORDS["ada"]).status_code == 429
        http.headers["X-Forwarded-For"] = "198.51.100.8"  # another client behind the same proxy
        assert sign_in(http, "ada", PASSWORDS["ada"]).status_code == 303
    assert {e["address"] for e in service_entries(env, "console_sign_in_failed")} == {"198.51.100.7"}
    [signed] = service_entries(env, "console_signed_in")
    assert signed["address"] == "198.51.100.8"


def test_client_address_is_the_right_most_hop_that_is_not_a_trusted_proxy() -> None:
    proxies = addresses.networks(["10.0.0.0/8", "192.0.2.1"])
    assert addresses.client_address("203.0.113.5", ["1.2.3.4"], proxies) == "203.0.113.5"  # untrusted peer
    assert addresses.client_address("10.1.1.1", [], proxies) == "10.1.1.1"
    assert addresses.client_address("10.1.1.1", ["6.6.6.6, 198.51.100.1"], proxies) == "198.51.100.1"
    chain = ["6.6.6.6, 198.51.100.1", "192.0.2.1, 10.2.2.2"]  # two headers, two proxies of ours
    assert addresses.client_address("10.1.1.1", chain, proxies) == "198.51.100.1"
    assert addresses.client_address("10.1.1.1", ["198.51.100.1, not-an-ip, 10.3.3.3"], proxies) == "10.3.3.3"
    assert addresses.client_address("10.1.1.1", ["[2001:db8::1]:443", "198.51.100.2:5555"], proxies) == ("198.51.100.2")
    assert addresses.client_address("::ffff:10.1.1.1", ["198.51.100.3"], proxies) == "198.51.100.3"
    assert addresses.client_address(None, ["198.51.100.3"], proxies) == "unknown"
    assert Settings(refund_agent_trusted_proxies=["10.0.0.0/8", "2001:db8::/32", "192.0.2.1"])
    with pytest.raises(ValidationError, match="not an IP address or CIDR network"):
        Settings(refund_agent_trusted_proxies=["proxy.internal"])


@pytest.fixture
def app_engine(env: Env) -> Iterator[sa.Engine]:
    upgrade(env.dbs.app_url)
    engine = create_engine(env.dbs.app_url)
    try:
        yield engine
    finally:
        engine.dispose()


def test_the_backoff_grows_to_its_cap_refuses_during_the_delay_and_forgives_a_success(app_engine: sa.Engine) -> None:
    backoff = sign_in_throttle.Backoff(2, timedelta(seconds=10), timedelta(seconds=35), timedelta(hours=1))
    limit = sign_in_throttle.AddressLimit(100, timedelta(minutes=5))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def attempt(at: float, address: str = "192.0.2.1") -> sign_in_throttle.Attempt:
        with app_engine.begin() as conn:
            now = t0 + timedelta(seconds=at)
            return sign_in_throttle.begin_attempt(
                conn, name_digest="d", address=address, now=now, backoff=backoff, limit=limit
            )

    assert [attempt(0).delay, attempt(1).delay] == [timedelta(0), timedelta(seconds=10)]  # the second failure
    assert attempt(10.5, "192.0.2.9").refused_by == "name"  # from anywhere
    delays = [attempt(at).delay for at in (11, 31.5, 66.5, 102)]
    assert delays == [timedelta(seconds=s) for s in (20, 35, 35, 35)]  # doubling, capped
    refused = attempt(136)
    assert refused.refused_by == "name" and refused.retry_after == timedelta(seconds=1)
    assert attempt(137).allowed  # the delay has passed: taken (and, were the password right...)
    with app_engine.begin() as conn:
        sign_in_throttle.attempt_succeeded(conn, name_digest="d", address="192.0.2.1")
    assert attempt(138).delay == timedelta(0)  # ...the name starts afresh
    assert attempt(138 + 3601).name_failures == 1  # failures a quiet hour old are forgotten


def test_the_address_limit_counts_failures_of_any_name_in_its_window(app_engine: sa.Engine) -> None:
    backoff = sign_in_throttle.Backoff(100, timedelta(seconds=1), timedelta(seconds=1), timedelta(hours=1))
    limit = sign_in_throttle.AddressLimit(3, timedelta(minutes=5))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def attempt(name: str, at: float) -> sign_in_throttle.Attempt:
        with app_engine.begin() as conn:
            now = t0 + timedelta(seconds=at)
            return sign_in_throttle.begin_attempt(
                conn, name_digest=name, address="192.0.2.1", now=now, backoff=backoff, limit=limit
            )

    assert all(attempt(name, n).allowed for n, name in enumerate("abc"))
    refused = attempt("d", 10)
    assert refused.refused_by == "address" and refused.retry_after == timedelta(seconds=290)
    assert attempt("d", 300).allowed  # a new window
