"""Security: anonymous callers change nothing, approval tokens and Slack requests are checked, secrets stay out of logs.

Runs a real `refund-agent serve` subprocess (tests/live.py) on SQLite and Postgres. The route sweep is
generic over the app's routes, so routes added later are covered without editing this file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from httpx import Response
from starlette.routing import Mount

from agent import tokens
from agent.http.server import create_app
from agent.ops.processes import wait_for
from tests.capture import CaptureServer
from tests.conftest import Env
from tests.identities import SLACK_DANA
from tests.live import LiveService, Secrets, live_service

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
FORM = "application/x-www-form-urlencoded"
#: A sign-in form is anonymous by design; it is still swept, and must still change nothing.
SIGN_IN = re.compile(r"/(login|logout|sign-?in|sign-?out)$")
_PARAM = re.compile(r"\{([^}:]+)(:[^}]*)?\}")


def _forged(refund_id: str, amount: str = "4200.00") -> str:
    claims = tokens.ApprovalClaims(
        refund_id, Decimal(amount), "USD", datetime.now(UTC) + timedelta(days=1), "operator:dana"
    )
    return tokens.sign(claims, b"an attacker's own key")


def _walk(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """Every (path, methods) the app serves: included routers (FastAPI >= 0.16x) and mounts flattened."""
    for route in routes:
        if hasattr(route, "effective_route_contexts"):  # an included router
            for ctx in route.effective_route_contexts():
                original = ctx.original_route
                yield prefix + (ctx.path or original.path), set(getattr(original, "methods", None) or ())
        elif isinstance(route, Mount):
            yield from _walk(route.routes, prefix + route.path)
        else:
            yield prefix + str(getattr(route, "path", "")), set(getattr(route, "methods", None) or ())


def _state_changing_routes(env: Env) -> list[tuple[str, str]]:
    app = create_app(env.settings())  # not started: only its route table is read
    return sorted({(m, path) for path, methods in _walk(app.routes) for m in methods if m in STATE_CHANGING})


def test_every_state_changing_route_refuses_anonymous_calls(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, _):
        assert svc.submit("sec-parked-0001", "ord_1002").status_code == 202
        before = svc.until("sec-parked-0001", "awaiting_approval")
        rows = svc.refund_rows()
        forged = _forged("sec-parked-0001")
        values = {"refund_id": "sec-parked-0001", "token": forged}
        routes = _state_changing_routes(env)
        assert ("POST", "/refunds") in routes and ("POST", "/refunds/{refund_id}/approval") in routes
        json_body = {"order_id": "ord_1001", "message": "anonymous", "decision": "approve", "approver": "mallory"}
        json_body |= {"token": forged, "amount": "42.00", "currency": "USD"}
        form_body = urlencode({"decision": "approve", "approver": "mallory", "token": forged})
        refused: dict[tuple[str, str], list[int]] = {}
        for method, template in routes:
            path = _PARAM.sub(lambda m: values.get(m[1], "anon-probe-0001"), template)
            for kind, content in (("application/json", json.dumps(json_body)), (FORM, form_body)):
                headers = {"Content-Type": kind, "Idempotency-Key": f"anon-probe-{len(refused):04d}"}
                response = svc.http.request(method, path, content=content, headers=headers, follow_redirects=False)
                status, location = response.status_code, response.headers.get("location", "")
                if status in (302, 303, 307) and re.search(r"log-?in|sign-?in", location):
                    status = 401  # a browser form sent to its sign-in page
                refused.setdefault((method, template), []).append(status)
        for (method, template), statuses in refused.items():
            if SIGN_IN.search(template):
                continue  # anonymous by design; the checks below still prove it changed nothing
            # Each route is reached in the encoding it reads (JSON or form): that call must be refused
            # as unauthenticated; the other encoding may be a plain client error, but never a success.
            assert any(s in (401, 403) for s in statuses), (method, template, statuses)
            assert all(400 <= s < 500 for s in statuses), (method, template, statuses)
        after = svc.status("sec-parked-0001")
        assert after["status"] == "awaiting_approval" and after["approval"]["decision"] is None
        assert after["approval"]["request"] == before["approval"]["request"]
        assert svc.refund_rows() == rows
        assert env.sandbox.refunds() == []


def _slack_headers(body: str, secret: str, *, ts: int | None = None) -> dict[str, str]:
    stamp = str(ts if ts is not None else int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": FORM,
    }


def _slack_body(token: str, decision: str = "approve", slack_id: str = SLACK_DANA, name: str = "dana") -> str:
    team, user = slack_id.split("/")
    payload: dict[str, Any] = {"type": "block_actions", "team": {"id": team}}
    payload["user"] = {"id": user, "team_id": team, "username": name}
    payload["actions"] = [{"action_id": decision, "value": token}]
    return urlencode({"payload": json.dumps(payload)})


def _slack_token(svc: LiveService, slack: CaptureServer, refund_id: str) -> str:
    """The token behind the Approve button of the Slack message about ``refund_id``."""

    def posted() -> str | None:
        for message in slack.received("webhook"):
            if refund_id in message["text"]:
                buttons = [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]
                return str(next(b["value"] for b in buttons if b["action_id"] == "approve"))
        return None

    found: str = wait_for(posted, timeout=10, what=f"the Slack message about {refund_id}")
    return found


def _click(svc: LiveService, token: str, decision: str = "approve", **extra: str) -> Response:
    """The approval page's form, as a browser posts it."""
    content = urlencode({"decision": decision, **extra})
    return svc.http.post(f"/approve/{token}", content=content, headers={"Content-Type": FORM})


def test_forged_expired_replayed_and_cross_refund_tokens_decide_nothing(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, slack):
        assert svc.submit("sec-token-A001", "ord_1002").status_code == 202
        assert svc.submit("sec-token-B001", "ord_1009").status_code == 202
        svc.until("sec-token-A001", "awaiting_approval")
        svc.until("sec-token-B001", "awaiting_approval")
        token_a, token_b = svc.link("sec-token-A001"), svc.link("sec-token-B001")
        secret = svc.keys.signing_secret.encode()
        body_b, _ = token_b.split(".")
        _, mac_a = token_a.split(".")
        expired = tokens.sign(
            tokens.ApprovalClaims(
                "sec-token-A001", Decimal("4200.00"), "USD", datetime.now(UTC) - timedelta(seconds=1), "operator:dana"
            ),
            secret,
        )
        assert _click(svc, _forged("sec-token-A001")).status_code == 401  # signed with another key
        assert _click(svc, f"{body_b}.{mac_a}").status_code == 401  # B's claims under A's signature
        assert _click(svc, expired).status_code == 410
        assert svc.http.get(f"/approve/{_forged('sec-token-A001')}").status_code == 401
        slack_b = _slack_token(svc, slack, "sec-token-B001")
        assert _click(svc, slack_b).status_code == 403  # Slack's token decides only through Slack

        first = _click(svc, token_a, approver="mallory")  # a typed name is not read: the link's approver decides
        replayed = _click(svc, token_a)  # the same click, replayed
        assert first.status_code == 200 and replayed.status_code == 200
        assert "operator:dana" in first.text and "mallory" not in first.text
        assert svc.decide("sec-token-A001", "reject", "4200.00").status_code == 409
        done = svc.until("sec-token-A001", "completed", "rejected", "failed")
        assert done["status"] == "completed" and done["approval"]["approver"] == "operator:dana"
        assert _click(svc, token_a).status_code == 200  # replayed after the payment
        assert len(env.sandbox.refunds("ch_ord_1002")) == 1

        slack_secret = svc.keys.slack_signing_secret
        body = _slack_body(slack_b)
        signed = _slack_headers(body, slack_secret)
        for headers, what in [
            (_slack_headers(body, slack_secret, ts=int(time.time()) - 6 * 60), "stale"),
            (_slack_headers(body, slack_secret, ts=int(time.time()) + 6 * 60), "from the future"),
            (_slack_headers(body, "not-the-secret"), "wrong secret"),
            ({**signed, "X-Slack-Request-Timestamp": str(int(time.time()) - 1)}, "timestamp edited"),
            ({"Content-Type": FORM}, "unsigned"),
        ]:
            assert svc.http.post("/slack/interactions", content=body, headers=headers).status_code == 401, what
        tampered = _slack_body(slack_b, slack_id="T0001/U0666")
        assert svc.http.post("/slack/interactions", content=tampered, headers=signed).status_code == 401
        b = svc.status("sec-token-B001")
        assert b["status"] == "awaiting_approval" and b["approval"]["decision"] is None
        assert env.sandbox.refunds("ch_ord_1009") == []


def test_secrets_never_appear_in_logs_of_a_full_run(env: Env, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # this process: the payments sandbox, Slack's stand-in
    for chatty in ("httpx", "httpcore"):  # the test's own HTTP client logs the URLs it calls (the CLI quiets these too)
        caplog.set_level(logging.WARNING, logger=chatty)
    keys = Secrets.fresh()
    with live_service(env, tmp_path, keys) as (svc, slack):
        assert svc.submit("sec-logs-small1", "ord_1001").status_code == 202
        assert svc.submit("sec-logs-link01", "ord_1002").status_code == 202
        assert svc.submit("sec-logs-slack1", "ord_1009").status_code == 202
        svc.until("sec-logs-link01", "awaiting_approval")
        svc.until("sec-logs-slack1", "awaiting_approval")
        link_token = svc.link("sec-logs-link01")
        slack_token = _slack_token(svc, slack, "sec-logs-slack1")
        assert svc.http.get(f"/approve/{link_token}").status_code == 200
        assert _click(svc, link_token).status_code == 200
        body = _slack_body(slack_token)
        answer = svc.http.post(
            "/slack/interactions", content=body, headers=_slack_headers(body, keys.slack_signing_secret)
        )
        assert answer.status_code == 200, answer.text
        for refund_id in ("sec-logs-small1", "sec-logs-link01", "sec-logs-slack1"):
            assert svc.until(refund_id, "completed", "rejected", "failed")["status"] == "completed"
        wait_for(lambda: slack.received("webhook") or None, timeout=10, what="the Slack approval messages")
        logs = svc.log_text() + "\n" + caplog.text
    for seen in (
        "POST /refunds",
        "POST /slack/interactions",
        "refund sec-logs-link01 paid",
        "refund sec-logs-slack1 paid",
    ):
        assert seen in logs  # the capture saw the whole run
    assert len(env.sandbox.refunds()) == 3
    secrets_in_use = {
        "API token": keys.api_token,
        "approvers' API key": keys.approver_key,
        "approval signing secret": keys.signing_secret,
        "Slack signing secret": keys.slack_signing_secret,
        "payments API key": keys.payments_api_key,
        "approval token (link)": link_token,
        "approval token (Slack)": slack_token,
        "approval token signature (link)": link_token.split(".")[1],
        "approval token signature (Slack)": slack_token.split(".")[1],
    }
    leaked = [(name, line) for name, value in secrets_in_use.items() for line in logs.splitlines() if value in line]
    assert leaked == []
