"""End to end over HTTP against a real `refund-agent serve` subprocess, killed and restarted at will."""

from __future__ import annotations

import hashlib
import hmac
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import sqlalchemy as sa

from agent import runtime, tokens
from agent.ops.processes import child_env, free_port, http_ok, spawn, stop, wait_for
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database
from tests import web
from tests.capture import CaptureServer
from tests.conftest import Env
from tests.identities import SLACK_DANA, add_approver_client, approver_env, link_token

TOKEN = "test-api-token-of-the-helpdesk-client"
SECRET = b"test-signing-secret-of-approval-links"
SLACK_SECRET = "test-slack-signing-secret-0123456"
APPROVER_KEY = "test-key-of-the-approvals-desk-client"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APPROVER = {"Authorization": f"Bearer {APPROVER_KEY}"}
FINAL = ("completed", "rejected", "failed", "cancelled")
FORM = "application/x-www-form-urlencoded"


class Server:
    def __init__(self, env: Env, logs: Path, slack: CaptureServer) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logs = logs
        self.vars = child_env(
            env.env_vars(
                REFUND_AGENT_API_TOKEN=TOKEN,
                APPROVAL_SIGNING_SECRET=SECRET.decode(),
                SLACK_SIGNING_SECRET=SLACK_SECRET,
                SLACK_WEBHOOK_URL=slack.url("webhook"),
                REFUND_AGENT_PORT=str(self.port),
                REFUND_AGENT_EXECUTOR_ID="test-server",
                **approver_env(),
            ),
            drop=("REFUND_AGENT_CRASH_AT",),
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = web.client(base_url=self.base, timeout=30)

    def start(self, crash_at: str | None = None) -> None:
        extra = {"REFUND_AGENT_CRASH_AT": crash_at} if crash_at else {}
        self.proc = spawn(["serve"], env={**self.vars, **extra}, log=self.logs / "server.log")
        try:
            wait_for(lambda: http_ok(f"{self.base}/readyz"), timeout=90, what="the server to be ready")
        except TimeoutError:
            print((self.logs / "server.log").read_text()[-5000:])
            raise

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def submit(
        self, key: str, order_id: str, message: str = "It broke, please refund.", **extra: Any
    ) -> httpx.Response:
        body = {"order_id": order_id, "message": message, "amount": None, "currency": None, **extra}
        return self.http.post("/refunds", json=body, headers={**AUTH, "Idempotency-Key": key})

    def status(self, refund_id: str) -> dict[str, Any]:
        response = self.http.get(f"/refunds/{refund_id}", headers=AUTH)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def until(self, refund_id: str, *statuses: str, timeout: float = 90) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(refund_id)
            return status if status["status"] in statuses else None

        return wait_for(check, timeout=timeout, what=f"{refund_id} to reach {statuses}", interval=0.2)

    def decide(
        self, refund_id: str, decision: str, amount: str = "4200.00", *, key: str = APPROVER_KEY
    ) -> httpx.Response:
        """A decision over the API, as the client whose key this is (the approvals desk by default)."""
        body = {"decision": decision, "amount": amount, "currency": "USD"}
        return self.http.post(f"/refunds/{refund_id}/approval", json=body, headers={"Authorization": f"Bearer {key}"})

    def click(self, token: str, decision: str = "approve") -> httpx.Response:
        """The approval page's button, as a browser posts it."""
        form = urlencode({"decision": decision})
        return self.http.post(f"/approve/{token}", content=form, headers={"Content-Type": FORM})

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        self.http.close()


@contextmanager
def running_server(env: Env, logs: Path, slack: CaptureServer) -> Iterator[Server]:
    settings = env.settings()
    runtime.migrate_databases(settings)
    open_app_database(settings.database.app_database_url)
    seed(app_db().engine)
    add_approver_client(app_db().engine, APPROVER_KEY)
    srv = Server(env, logs, slack)
    srv.start()
    try:
        yield srv
    except BaseException:
        print((logs / "server.log").read_text()[-5000:])
        raise
    finally:
        srv.close()
        close_app_database()


@pytest.fixture
def slack() -> Iterator[CaptureServer]:
    with CaptureServer() as capture:
        yield capture


@pytest.fixture
def server(env: Env, tmp_path: Path, slack: CaptureServer) -> Iterator[Server]:
    with running_server(env, tmp_path / "logs", slack) as srv:
        yield srv


@pytest.fixture(scope="module")
def refusing_server(module_env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server per backend for the tests of requests it refuses: none of them may start anything, so they
    share it (and its sandbox's empty ledger says so for all of them)."""
    with CaptureServer() as capture, running_server(module_env, tmp_path_factory.mktemp("logs"), capture) as srv:
        yield srv


def test_submit_and_follow_to_completed(env: Env, server: Server) -> None:
    accepted = server.submit("http-small-0001", "ord_1001")
    assert accepted.status_code == 202
    body = accepted.json()
    assert body["refund_id"] == "http-small-0001" and body["status_url"] == "/refunds/http-small-0001"
    done = server.until("http-small-0001", *FINAL)
    assert done["status"] == "completed" and done["amount"] == "42.00" and done["currency"] == "USD"
    assert done["payment"]["idempotency_key"] == "refund:http-small-0001:ord_1001"
    assert done["payment"]["provider_refund_id"] == env.sandbox.refunds("ch_ord_1001")[0]["id"]
    assert any(step["name"] == "payments.issue_refund" for step in done["steps"])
    again = server.submit("http-small-0001", "ord_1001")
    assert again.status_code == 200 and again.json()["refund_id"] == "http-small-0001"
    other = server.submit("http-small-0001", "ord_1001", message="something else")
    assert other.status_code == 409 and "different request body" in other.json()["detail"]
    listed = server.http.get("/refunds", params={"status": "completed"}, headers=AUTH).json()
    assert [r["refund_id"] for r in listed["items"]] == ["http-small-0001"]
    orders = server.http.get("/orders", params={"limit": 100}, headers=AUTH).json()["items"]
    refundable = {o["order_id"]: o["refundable"] for o in orders}
    assert refundable["ord_1001"] == "0.00" and refundable["ord_1004"] == "0.00" and refundable["ord_1005"] == "0.00"
    assert len(env.sandbox.refunds()) == 1


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({**AUTH}, {"order_id": "ord_1001", "message": "x"}, 400),  # no Idempotency-Key
        ({"Idempotency-Key": "anon-key-0001"}, {"order_id": "ord_1001", "message": "x"}, 401),
        (
            {"Authorization": "Bearer nope", "Idempotency-Key": "bad-token-001"},
            {"order_id": "ord_1001", "message": "x"},
            401,
        ),
        ({**AUTH, "Idempotency-Key": "bad-amount-01"}, {"order_id": "ord_1001", "message": "x", "amount": "1e3"}, 422),
        ({**AUTH, "Idempotency-Key": "bad-amount-02"}, {"order_id": "ord_1001", "message": "x", "amount": "-1"}, 422),
        ({**AUTH, "Idempotency-Key": "bad-amount-03"}, {"order_id": "ord_1001", "message": "x", "amount": "NaN"}, 422),
        ({**AUTH, "Idempotency-Key": "bad-amount-04"}, {"order_id": "ord_1001", "message": "x", "amount": 12.5}, 422),
        ({**AUTH, "Idempotency-Key": "bad-amount-05"}, {"order_id": "ord_1001", "message": "x", "amount": "0"}, 422),
        (
            {**AUTH, "Idempotency-Key": "bad-currency1"},
            {"order_id": "ord_1001", "message": "x", "currency": "XYZ"},
            422,
        ),
        (
            {**AUTH, "Idempotency-Key": "bad-currency2"},
            {"order_id": "ord_1001", "message": "x", "currency": "EUR"},
            422,
        ),
        ({**AUTH, "Idempotency-Key": "bad-order-001"}, {"order_id": "ord_nope", "message": "x"}, 404),
        ({**AUTH, "Idempotency-Key": "bad-message-1"}, {"order_id": "ord_1001", "message": ""}, 422),
        ({**AUTH, "Idempotency-Key": "bad-extra-001"}, {"order_id": "ord_1001", "message": "x", "admin": True}, 422),
    ],
)
def test_bad_requests_get_problem_details_and_start_nothing(
    module_env: Env, refusing_server: Server, headers: dict[str, str], body: dict[str, Any], status: int
) -> None:
    response = refusing_server.http.post("/refunds", json=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    assert "Traceback" not in response.text
    assert module_env.sandbox.refunds() == []


def test_transport_limits_and_reads_need_the_token(refusing_server: Server) -> None:
    server = refusing_server
    huge = server.http.post(
        "/refunds",
        content=b'{"order_id": "ord_1001", "message": "' + b"x" * 70_000 + b'"}',
        headers={**AUTH, "Idempotency-Key": "huge-body-0001", "Content-Type": "application/json"},
    )
    assert huge.status_code == 413
    text = server.http.post("/refunds", content=b"hello", headers={**AUTH, "Content-Type": "text/plain"})
    assert text.status_code == 415
    assert server.http.get("/refunds/whatever").status_code == 401
    assert server.http.get("/orders").status_code == 401
    assert server.http.get("/refunds/no-such-refund", headers=AUTH).status_code == 404
    assert server.http.get("/healthz").json() == {"ok": True}
    assert server.http.get("/openapi.json").json()["info"]["title"] == "refund-agent"


def _parked(server: Server, key: str, order_id: str = "ord_1002") -> dict[str, Any]:
    assert server.submit(key, order_id).status_code == 202
    return server.until(key, "awaiting_approval")


def _link(key: str) -> str:
    token = wait_for(lambda: link_token(app_db().engine, key), timeout=10, what="dana's approval link")
    return token


def test_big_refund_approved_by_the_link_sent_to_its_approver(env: Env, server: Server, slack: CaptureServer) -> None:
    status = _parked(server, "http-big-00001")
    assert "token" not in status["approval"] and "approve_url" not in status["approval"]  # not for the requester
    token = _link("http-big-00001")
    page = server.http.get(f"/approve/{token}")
    assert page.status_code == 200 and "4,200.00 USD" in page.text and "ord_1002" in page.text
    assert "operator:dana" in page.text and 'name="approver"' not in page.text and "name='approver'" not in page.text
    assert (
        page.headers["Cache-Control"] == "no-store"
        and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    )
    form = server.click(token)
    assert form.status_code == 200 and "Decision recorded" in form.text and "operator:dana" in form.text
    done = server.until("http-big-00001", *FINAL)
    assert done["status"] == "completed"
    assert (done["approval"]["approver"], done["approval"]["via"]) == ("operator:dana", "link")
    decided_page = server.http.get(f"/approve/{token}")
    assert "Refund decided" in decided_page.text and "<button" not in decided_page.text
    same = server.decide("http-big-00001", "approve")
    assert same.status_code == 200 and same.json()["first"] is False and same.json()["approver"] == "operator:dana"
    other = server.decide("http-big-00001", "reject")
    assert other.status_code == 409 and other.json()["recorded"]["decision"] == "approve"
    assert len(env.sandbox.refunds("ch_ord_1002")) == 1
    log = (server.logs / "server.log").read_text()
    assert "GET /approve/<token>" in log and token not in log and TOKEN not in log
    [posted] = wait_for(lambda: slack.received("webhook") or None, timeout=10, what="the Slack webhook post")
    buttons = [e for b in posted["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert {b["action_id"] for b in buttons} == {"approve", "reject", "open"}
    assert tokens.verify(next(b["value"] for b in buttons if b["action_id"] == "approve"), SECRET).approver == "slack"
    assert next(b["url"] for b in buttons if b["action_id"] == "open").endswith("/console/refunds/http-big-00001")


def test_forged_expired_and_cross_refund_tokens_are_refused(env: Env, server: Server) -> None:
    _parked(server, "http-token-0001")
    token = _link("http-token-0001")
    body, mac = token.split(".")
    assert server.click(body + "." + mac[::-1]).status_code == 401
    assert server.click("not-a-token-at-all").status_code == 401
    past = tokens.sign(
        tokens.ApprovalClaims(
            "http-token-0001", Decimal("4200.00"), "USD", datetime.now(UTC) - timedelta(minutes=1), "operator:dana"
        ),
        SECRET,
    )
    assert server.click(past).status_code == 410
    wrong_amount = tokens.sign(
        tokens.ApprovalClaims(
            "http-token-0001", Decimal("42.00"), "USD", datetime.now(UTC) + timedelta(days=1), "operator:dana"
        ),
        SECRET,
    )
    assert server.click(wrong_amount).status_code == 409
    assert server.decide("http-token-0001", "approve", amount="4200.01").status_code == 422  # more than it awaits
    assert server.http.get(f"/approve/{body}.{mac[::-1]}").status_code == 401
    assert server.status("http-token-0001")["approval"]["decision"] is None
    small = server.submit("http-token-0002", "ord_1001")
    assert small.status_code == 202
    server.until("http-token-0002", *FINAL)
    unneeded = tokens.sign(
        tokens.ApprovalClaims(
            "http-token-0002", Decimal("42.00"), "USD", datetime.now(UTC) + timedelta(days=1), "operator:dana"
        ),
        SECRET,
    )
    assert server.click(unneeded).status_code == 409
    assert env.sandbox.refunds("ch_ord_1002") == []


def _concurrently(count: int, call: Any) -> list[httpx.Response]:
    barrier = threading.Barrier(count)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        with web.client(timeout=60) as client:
            barrier.wait()
            response = call(client, i)
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return responses


def test_twenty_concurrent_approvals_make_one_decision(env: Env, server: Server) -> None:
    _parked(server, "http-race-00001")
    url = f"{server.base}/refunds/http-race-00001/approval"
    responses = _concurrently(
        20,
        lambda c, i: c.post(
            url,
            json={"decision": "approve" if i % 2 else "reject", "amount": "4200.00", "currency": "USD"},
            headers=APPROVER,
        ),
    )
    ok = [r.json() for r in responses if r.status_code == 200]
    assert {r.status_code for r in responses} <= {200, 409}
    assert sum(1 for body in ok if body["first"]) == 1
    assert len({(body["decision"], body["approver"]) for body in ok}) == 1
    done = server.until("http-race-00001", *FINAL)
    assert len(env.sandbox.refunds("ch_ord_1002")) == (1 if done["status"] == "completed" else 0)


def test_twenty_concurrent_submits_with_one_key_make_one_refund(env: Env, server: Server) -> None:
    body = {"order_id": "ord_1001", "message": "refund please", "amount": None, "currency": None}
    responses = _concurrently(
        20,
        lambda c, _: c.post(
            f"{server.base}/refunds", json=body, headers={**AUTH, "Idempotency-Key": "http-same-key-01"}
        ),
    )
    assert {r.status_code for r in responses} <= {200, 202}
    assert {r.json()["refund_id"] for r in responses} == {"http-same-key-01"}
    assert server.until("http-same-key-01", *FINAL)["status"] == "completed"
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_lost_database_connections_answer_503_then_the_retry_succeeds_and_a_stop_is_clean(
    env: Env, server: Server
) -> None:
    if env.backend != "postgres":
        pytest.skip("cuts Postgres sessions")
    warm = server.submit("http-warm-0001", "ord_1001").json()["refund_id"]
    assert server.until(warm, *FINAL)["status"] == "completed"
    answered: dict[str, httpx.Response] = {}
    # The worker's lease renewal shares the database and may meet a cut connection first, healing the pool
    # before the request does; cut and submit again until a request is the one that meets it.
    for attempt in range(10):
        server.status(warm)  # the pool holds a live connection again
        assert env.cut_app_database_sessions() > 0
        key = f"http-cut-{attempt:04d}"
        answered[key] = server.submit(key, "ord_1002", amount="1.00", currency="USD")
        if answered[key].status_code == 503:
            break
    assert {r.status_code for r in answered.values()} <= {202, 503}, {k: r.text for k, r in answered.items()}
    unavailable = answered[key]
    assert unavailable.status_code == 503, "no request met a cut connection in 10 attempts"
    assert unavailable.headers["Retry-After"] == "1"
    assert unavailable.headers["content-type"] == "application/problem+json"
    assert "Idempotency-Key" in unavailable.json()["detail"]
    # The retry goes out on the same keep-alive connection: the 503 did not close it.
    assert server.submit(key, "ord_1002", amount="1.00", currency="USD").status_code in (200, 202)
    for k in answered:
        assert server.until(k, *FINAL)["status"] == "completed"
    paid = [r["metadata"]["refund_id"] for r in env.sandbox.refunds("ch_ord_1002")]
    assert sorted(paid) == sorted(answered)
    # A stop right after another cut still drains, releases the executor lease and exits 0.
    server.status(warm)
    assert env.cut_app_database_sessions() > 0
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    with env.app_engine().connect() as conn:
        state = conn.execute(
            sa.text("SELECT state FROM executor_leases WHERE executor_id = 'test-server'")
        ).scalar_one()
    assert state == "stopped"


def test_server_killed_while_parked_finishes_after_restart(env: Env, server: Server) -> None:
    _parked(server, "http-parked-0001")
    server.kill()
    server.start()
    assert server.status("http-parked-0001")["status"] == "awaiting_approval"
    assert server.decide("http-parked-0001", "approve").status_code == 200
    assert server.until("http-parked-0001", *FINAL)["status"] == "completed"
    assert len(env.sandbox.refunds("ch_ord_1002")) == 1


def test_server_killed_mid_payment_pays_once_and_resubmit_returns_same_refund(env: Env, server: Server) -> None:
    server.close()
    server.http = web.client(base_url=server.base, timeout=30)
    server.start(crash_at="after_provider_call")
    assert server.submit("http-midpay-0001", "ord_1001").status_code == 202
    assert server.proc is not None
    wait_for(server.proc.poll, timeout=60, what="the server to die in the payment step")
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1  # the provider applied it; nobody recorded it
    server.start()
    again = server.submit("http-midpay-0001", "ord_1001")
    assert again.status_code == 200 and again.json()["refund_id"] == "http-midpay-0001"
    done = server.until("http-midpay-0001", *FINAL)
    assert done["status"] == "completed"
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1
    assert env.sandbox.stats()["replays"] == 1


def _slack_request(body: str, *, secret: str = SLACK_SECRET, ts: int | None = None) -> dict[str, str]:
    stamp = str(ts if ts is not None else int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def test_slack_buttons_decide_once_with_verified_signatures(env: Env, server: Server, slack: CaptureServer) -> None:
    _parked(server, "http-slack-00001")
    [posted] = wait_for(lambda: slack.received("webhook") or None, timeout=10, what="the Slack approval message")
    token = next(
        e["value"]
        for b in posted["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "approve"
    )
    team, user = SLACK_DANA.split("/")
    payload = {
        "type": "block_actions",
        "team": {"id": team},
        "user": {"id": user, "username": "anything-they-like", "team_id": team},
        "actions": [{"action_id": "approve", "value": token}],
        "response_url": slack.url("response"),
    }
    body = urlencode({"payload": json.dumps(payload)})
    wrong = server.http.post("/slack/interactions", content=body, headers=_slack_request(body, secret="nope"))
    assert wrong.status_code == 401
    stale = server.http.post(
        "/slack/interactions", content=body, headers=_slack_request(body, ts=int(time.time()) - 600)
    )
    assert stale.status_code == 401
    headers = _slack_request(body)
    ok = server.http.post("/slack/interactions", content=body, headers=headers)
    assert ok.status_code == 200 and f"approve by operator:dana (slack:{SLACK_DANA})" in ok.json()["text"]
    replay = server.http.post("/slack/interactions", content=body, headers=headers)
    assert replay.status_code == 409
    [update] = wait_for(lambda: slack.received("response") or None, timeout=10, what="the message update")
    assert update["replace_original"] is True and "approve by operator:dana" in update["text"]
    assert update["mrkdwn"] is False and update["unfurl_links"] is False
    done = server.until("http-slack-00001", *FINAL)
    assert done["status"] == "completed"
    assert (done["approval"]["approver"], done["approval"]["via"]) == ("operator:dana", f"slack:{SLACK_DANA}")
    assert len(env.sandbox.refunds("ch_ord_1002")) == 1
