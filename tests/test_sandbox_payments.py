"""Behaviour of the local Stripe-compatible refunds sandbox, driven over HTTP (stripe SDK + httpx)."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from unittest.mock import ANY

import httpx
import psycopg
import pytest
import sqlalchemy as sa
import stripe
import uvicorn
from psycopg import sql

from sandbox.ledger import Ledger
from sandbox.ledger_records import Claimed, Refund
from sandbox.ledger_tables import metadata
from sandbox.payments import create_app
from tests import web
from tests.conftest import BACKENDS, PG_SERVER

API_KEY = "sk_test_sandbox"


@dataclass
class Sandbox:
    base_url: str
    database_url: str
    app: Any

    def stripe(self, api_key: str = API_KEY, retries: int = 0) -> stripe.StripeClient:
        return stripe.StripeClient(api_key, base_addresses={"api": self.base_url}, max_network_retries=retries)

    def http(self, api_key: str | None = API_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return web.client(base_url=self.base_url, headers=headers, timeout=30)

    def set_faults(self, **faults: Any) -> None:
        with self.http() as client:
            client.put("/_sandbox/faults", json=faults).raise_for_status()

    def stats(self) -> dict[str, int]:
        with self.http() as client:
            response = client.get("/_sandbox/stats")
            response.raise_for_status()
            return dict(response.json())

    def refunds_for(self, charge: str) -> int:
        return int(self.app.state.ledger.count_refunds(charge=charge))

    def charge(self, amount: int = 100_000, currency: str = "usd", **more: Any) -> str:
        """A new charge at the sandbox (the admin endpoint), as a payment would have made it."""
        new = {"id": f"ch_{secrets.token_hex(6)}", "amount": amount, "currency": currency} | more
        with self.http() as client:
            client.post("/_sandbox/charges", json=[new]).raise_for_status()
        return str(new["id"])


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _serve(app: Any) -> tuple[str, Callable[[], None]]:
    # A pre-bound socket on port 0 avoids the pick-a-free-port race.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while True:
        try:
            if web.get(f"{base_url}/_sandbox/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("sandbox server did not become healthy")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()

    return base_url, stop


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    url = sa.make_url(PG_SERVER)
    name = f"refund_agent_sandbox_test_{secrets.token_hex(4)}"
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sandbox.db'}"
    url: str = request.getfixturevalue("postgres_database")
    ledger = Ledger(url)  # one database per session, so empty it for each test
    ledger.create_tables()
    with ledger.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    ledger.close()
    return url


@pytest.fixture
def start_sandbox(database_url: str) -> Iterator[Callable[..., Sandbox]]:
    stoppers: list[Callable[[], None]] = []

    def start(**options: Any) -> Sandbox:
        app = create_app(database_url=database_url, **({"api_key": API_KEY} | options))
        base_url, stop = _serve(app)
        stoppers.append(stop)
        return Sandbox(base_url, database_url, app)

    yield start
    for stop in reversed(stoppers):
        stop()


@pytest.fixture
def sandbox(start_sandbox: Callable[..., Sandbox]) -> Sandbox:
    return start_sandbox()


def test_create_retrieve_and_list_with_the_stripe_sdk(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge()
    params: Any = {
        "charge": charge,
        "amount": 1250,
        "reason": "requested_by_customer",
        "metadata": {"case": "c1"},
    }
    refund = client.v1.refunds.create(params=params)
    assert refund.id.startswith("re_") and refund.object == "refund"
    assert (refund.amount, refund.currency, refund.charge) == (1250, "usd", charge)
    assert refund.status == "succeeded" and refund.reason == "requested_by_customer"
    assert refund.metadata is not None and refund.metadata.to_dict() == {"case": "c1"}
    assert isinstance(refund.created, int)
    assert client.v1.refunds.retrieve(refund.id).to_dict() == refund.to_dict()
    listed = client.v1.refunds.list(params={"charge": charge})
    assert [r.id for r in listed.data] == [refund.id] and listed.has_more is False


def test_same_key_same_params_replays_first_refund(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge(currency="eur")
    params: Any = {"charge": charge, "amount": 500, "currency": "EUR"}
    first = client.v1.refunds.create(params=params, options={"idempotency_key": "k-replay"})
    second = client.v1.refunds.create(params=params, options={"idempotency_key": "k-replay"})
    assert second.id == first.id and second.currency == "eur"
    assert first.last_response is not None and second.last_response is not None
    assert "idempotent-replayed" not in first.last_response.headers
    assert second.last_response.headers["idempotent-replayed"] == "true"
    assert second.last_response.body == first.last_response.body  # byte-for-byte replay
    assert second.last_response.idempotency_key == "k-replay"
    assert sandbox.refunds_for(charge) == 1
    assert sandbox.stats() == {
        "create_requests": 2,
        "refunds_applied": 1,
        "replays": 1,
        "faults_injected": 0,
        "refunds_failed": 0,
        "events_delivered": 0,
    }


def test_same_key_different_params_is_idempotency_error(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge()
    client.v1.refunds.create(params={"charge": charge, "amount": 500}, options={"idempotency_key": "k-diff"})
    with pytest.raises(stripe.IdempotencyError) as raised:
        client.v1.refunds.create(params={"charge": charge, "amount": 501}, options={"idempotency_key": "k-diff"})
    assert raised.value.http_status == 400
    assert sandbox.refunds_for(charge) == 1


def test_concurrent_same_key_gets_409_or_replay_and_one_refund(sandbox: Sandbox) -> None:
    charge, barrier = sandbox.charge(), threading.Barrier(10)

    def attempt(_: int) -> tuple[int, dict[str, Any]]:
        with sandbox.http() as client:
            barrier.wait()
            data, headers = {"charge": charge, "amount": "700"}, {"Idempotency-Key": "k-race"}
            response = client.post("/v1/refunds", data=data, headers=headers)
            return response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(attempt, range(10)))
    ok_ids = {body["id"] for status, body in results if status == 200}
    conflicts = [body for status, body in results if status == 409]
    assert len(ok_ids) == 1 and len(conflicts) + sum(status == 200 for status, _ in results) == 10
    assert all(body["error"]["type"] == "idempotency_error" for body in conflicts)
    assert sandbox.refunds_for(charge) == 1


def test_in_flight_key_is_409_until_the_claim_goes_stale(start_sandbox: Callable[..., Sandbox]) -> None:
    clock = FakeClock()
    sandbox = start_sandbox(clock=clock, in_flight_timeout_seconds=30)
    charge = sandbox.charge()
    # Another process claimed the key and then died before applying anything.
    other = Ledger(sandbox.database_url)
    claim = other.claim_key("k-stuck", "someone-else", now=clock(), ttl_seconds=86400, stale_after_seconds=30)
    assert isinstance(claim, Claimed)
    client = sandbox.stripe()
    with pytest.raises(stripe.APIError) as raised:
        client.v1.refunds.create(params={"charge": charge, "amount": 100}, options={"idempotency_key": "k-stuck"})
    assert raised.value.http_status == 409
    assert raised.value.json_body == {  # the SDK's APIError leaves .code unset for 409s
        "error": {"type": "idempotency_error", "message": ANY, "code": "idempotency_key_in_use"}
    }
    clock.now += 31
    refund = client.v1.refunds.create(params={"charge": charge, "amount": 100}, options={"idempotency_key": "k-stuck"})
    # Had the old holder only been slow, it could no longer commit under its stale claim.
    late = Refund("re_late", charge, 100, "usd", None, {}, int(clock()))
    assert other.apply_refund(late, claim=("k-stuck", claim.token)) is None
    other.close()
    assert sandbox.refunds_for(charge) == 1 and refund.charge == charge


def test_expired_key_creates_new_refund(start_sandbox: Callable[..., Sandbox]) -> None:
    sandbox = start_sandbox(key_ttl_seconds=0.3)
    client, charge = sandbox.stripe(), sandbox.charge()
    params: Any = {"charge": charge, "amount": 900}
    first = client.v1.refunds.create(params=params, options={"idempotency_key": "k-ttl"})
    time.sleep(0.35)  # the key was claimed before `first` returned, so it is now past its TTL
    second = client.v1.refunds.create(params=params, options={"idempotency_key": "k-ttl"})
    assert second.id != first.id
    assert second.last_response is not None and "idempotent-replayed" not in second.last_response.headers
    assert sandbox.refunds_for(charge) == 2


def test_dropped_response_applies_refund_and_retry_replays_it(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge()
    sandbox.set_faults(drop_next=1)
    params: Any = {"charge": charge, "amount": 300}
    with pytest.raises(stripe.APIError) as raised:
        client.v1.refunds.create(params=params, options={"idempotency_key": "k-drop"})
    assert raised.value.http_status == 500
    assert sandbox.refunds_for(charge) == 1  # the client saw a failure, but the money moved
    retried = client.v1.refunds.create(params=params, options={"idempotency_key": "k-drop"})
    assert retried.last_response is not None and retried.last_response.headers["idempotent-replayed"] == "true"
    assert client.v1.refunds.list(params={"charge": charge}).data[0].id == retried.id
    assert sandbox.stats() == {
        "create_requests": 2,
        "refunds_applied": 1,
        "replays": 1,
        "faults_injected": 1,
        "refunds_failed": 0,
        "events_delivered": 0,
    }


def test_sdk_network_retries_recover_a_dropped_response_by_replay(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(retries=2), sandbox.charge()
    sandbox.set_faults(drop_next=1)
    refund = client.v1.refunds.create(params={"charge": charge, "amount": 42})  # the SDK picks the key
    assert refund.last_response is not None and refund.last_response.headers["idempotent-replayed"] == "true"
    assert sandbox.refunds_for(charge) == 1


def test_an_injected_500_is_saved_for_the_key_and_replayed_as_stripe_does(sandbox: Sandbox) -> None:
    """Stripe saves a 500 once the endpoint started executing: the same key can never succeed."""
    client, charge = sandbox.stripe(), sandbox.charge()
    sandbox.set_faults(fail_next=1)
    params: Any = {"charge": charge, "amount": 250}
    with pytest.raises(stripe.APIError) as raised:
        client.v1.refunds.create(params=params, options={"idempotency_key": "k-fail"})
    assert raised.value.http_status == 500 and sandbox.refunds_for(charge) == 0
    assert raised.value.headers is not None and "idempotent-replayed" not in raised.value.headers
    with pytest.raises(stripe.APIError) as replayed:
        client.v1.refunds.create(params=params, options={"idempotency_key": "k-fail"})
    assert replayed.value.http_status == 500 and replayed.value.headers is not None
    assert replayed.value.headers["idempotent-replayed"] == "true"
    assert replayed.value.json_body == raised.value.json_body
    other_key = client.v1.refunds.create(params=params, options={"idempotency_key": "k-fail-2"})
    assert sandbox.refunds_for(charge) == 1 and other_key.status == "succeeded"
    expected = {"create_requests": 3, "refunds_applied": 1, "replays": 1, "faults_injected": 1}
    assert {k: sandbox.stats()[k] for k in expected} == expected


def test_seeded_fail_rate_is_reproducible(sandbox: Sandbox) -> None:
    charge = sandbox.charge()

    def outcomes() -> list[int]:
        sandbox.set_faults(fail_rate=0.5, seed=7)
        with sandbox.http() as client:
            return [client.post("/v1/refunds", data={"charge": charge, "amount": "1"}).status_code for _ in range(12)]

    first = outcomes()
    assert first == outcomes() and {200, 500} == set(first)


def test_list_filters_only_as_stripe_does_by_charge_payment_intent_and_created(sandbox: Sandbox) -> None:
    client = sandbox.stripe()
    charge, other = sandbox.charge(payment_intent="pi_list_one"), sandbox.charge()
    made = [
        client.v1.refunds.create(params={"charge": charge, "amount": 10 + i, "metadata": {"batch": str(i % 2)}})
        for i in range(5)
    ]
    client.v1.refunds.create(params={"charge": other, "amount": 99, "metadata": {"batch": "1"}})
    newest_first = [r.id for r in reversed(made)]
    page = client.v1.refunds.list(params={"charge": charge, "limit": 2})
    assert [r.id for r in page.data] == newest_first[:2] and page.has_more is True
    rest = client.v1.refunds.list(params={"charge": charge, "starting_after": page.data[-1].id})
    assert [r.id for r in rest.data] == newest_first[2:] and rest.has_more is False
    assert [r.id for r in page.auto_paging_iter()] == newest_first
    before = client.v1.refunds.list(params={"charge": charge, "ending_before": newest_first[2], "limit": 10})
    assert [r.id for r in before.data] == newest_first[:2]
    by_intent = client.v1.refunds.list(params={"payment_intent": "pi_list_one", "limit": 100})
    assert [r.id for r in by_intent.data] == newest_first
    assert all(r.payment_intent == "pi_list_one" for r in by_intent.data)
    created = made[0].created
    in_range = client.v1.refunds.list(params={"created": {"gte": created, "lte": created + 3600}, "limit": 100})
    assert set(newest_first) <= {r.id for r in in_range.data}
    assert client.v1.refunds.list(params={"created": {"gt": created + 3600}}).data == []
    with sandbox.http() as http:
        body = http.get("/v1/refunds", params={"charge": charge}).json()
        assert body["object"] == "list" and body["url"] == "/v1/refunds"
        # Stripe lists refunds by charge, payment intent and creation time only; metadata is not a filter.
        refused = http.get("/v1/refunds", params={"charge": charge, "metadata[batch]": "1"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "parameter_unknown"
        assert http.get("/v1/refunds", params={"limit": 101}).json()["error"]["param"] == "limit"


def test_wrong_api_key_is_401(sandbox: Sandbox) -> None:
    with pytest.raises(stripe.AuthenticationError):
        sandbox.stripe(api_key="sk_test_wrong").v1.refunds.list()
    with sandbox.http(api_key=None) as anonymous:
        response = anonymous.get("/v1/refunds")
        assert response.status_code == 401 and response.json()["error"]["type"] == "invalid_request_error"
        assert anonymous.get("/_sandbox/stats").status_code == 401
        assert anonymous.get("/_sandbox/healthz").json() == {"ok": True}
        assert anonymous.get("/v1/refunds", auth=(API_KEY, "")).status_code == 200  # basic auth, key as user


def test_any_key_is_accepted_when_none_is_configured(start_sandbox: Callable[..., Sandbox]) -> None:
    sandbox = start_sandbox(api_key=None)
    assert sandbox.stripe(api_key="sk_test_anything").v1.refunds.list().data == []
    with sandbox.http(api_key=None) as anonymous:
        assert anonymous.get("/v1/refunds").status_code == 401


def test_invalid_params_are_400_and_do_not_burn_the_key(sandbox: Sandbox) -> None:
    charge = sandbox.charge()
    bad = [
        ({"amount": "5"}, "charge"),
        ({"charge": "ch_unknown", "amount": "5"}, "charge"),  # 404: no such charge
        ({"charge": charge, "payment_intent": "pi_x", "amount": "5"}, "payment_intent"),
        ({"charge": charge, "amount": "5", "currency": "eur"}, "currency"),  # not the charge's currency
        ({"charge": charge, "amount": "0"}, "amount"),
        ({"charge": charge, "amount": "1.5"}, "amount"),
        ({"charge": charge, "amount": "5", "currency": "dollars"}, "currency"),
        ({"charge": charge, "amount": "5", "reason": "because"}, "reason"),
        ({"charge": charge, "amount": "5", "foo": "x"}, "foo"),
    ]
    with sandbox.http() as http:
        for data, param in bad:
            response = http.post("/v1/refunds", data=data, headers={"Idempotency-Key": "k-bad"})
            error = response.json()["error"]
            assert (response.status_code, error["type"], error["param"]) == (
                404 if data.get("charge") == "ch_unknown" else 400,
                "invalid_request_error",
                param,
            )
        ok = http.post("/v1/refunds", data={"charge": charge, "amount": "5"}, headers={"Idempotency-Key": "k-bad"})
        assert ok.status_code == 200 and "idempotent-replayed" not in ok.headers
    assert sandbox.refunds_for(charge) == 1
    with pytest.raises(stripe.InvalidRequestError) as raised:
        sandbox.stripe().v1.refunds.retrieve("re_missing")
    assert raised.value.http_status == 404 and raised.value.code == "resource_missing"


def test_processes_sharing_a_database_share_keys_and_stats(start_sandbox: Callable[..., Sandbox]) -> None:
    first, second = start_sandbox(), start_sandbox()  # two servers, two engines, one database
    params: Any = {"charge": first.charge(), "amount": 77}
    made = first.stripe().v1.refunds.create(params=params, options={"idempotency_key": "k-shared"})
    replayed = second.stripe().v1.refunds.create(params=params, options={"idempotency_key": "k-shared"})
    assert replayed.id == made.id
    expected = {
        "create_requests": 2,
        "refunds_applied": 1,
        "replays": 1,
        "faults_injected": 0,
        "refunds_failed": 0,
        "events_delivered": 0,
    }
    assert first.stats() == second.stats() == expected


def test_faults_endpoint_rejects_invalid_settings(sandbox: Sandbox) -> None:
    with sandbox.http() as http:
        assert http.put("/_sandbox/faults", json={"fail_rate": 2}).status_code in (400, 422)
        assert http.put("/_sandbox/faults", json={"latency_ms": 5}).json()["latency_ms"] == 5


def test_a_charge_refuses_over_refunds_and_refunds_once_fully_refunded(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge(amount=1000, currency="eur")
    with pytest.raises(stripe.InvalidRequestError) as too_large:
        client.v1.refunds.create(params={"charge": charge, "amount": 1001}, options={"idempotency_key": "k-big"})
    assert (too_large.value.http_status, too_large.value.code) == (400, "amount_too_large")
    part = client.v1.refunds.create(params={"charge": charge, "amount": 400})
    assert (part.currency, client.v1.charges.retrieve(charge).amount_refunded) == ("eur", 400)
    rest = client.v1.refunds.create(params={"charge": charge})  # no amount: what is left
    assert rest.amount == 600 and client.v1.charges.retrieve(charge).refunded is True
    with pytest.raises(stripe.InvalidRequestError) as done:
        client.v1.refunds.create(params={"charge": charge, "amount": 1})
    assert (done.value.http_status, done.value.code) == (400, "charge_already_refunded")
    # The refusal was executed, so Stripe saved it for the key: the same request replays it.
    with pytest.raises(stripe.InvalidRequestError) as replayed:
        client.v1.refunds.create(params={"charge": charge, "amount": 1001}, options={"idempotency_key": "k-big"})
    assert replayed.value.code == "amount_too_large" and replayed.value.headers is not None
    assert replayed.value.headers["idempotent-replayed"] == "true"
    assert sandbox.refunds_for(charge) == 2


def test_a_refund_by_payment_intent_takes_the_intents_charge(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge(amount=500, currency="gbp", payment_intent="pi_by_intent")
    refund = client.v1.refunds.create(params={"payment_intent": "pi_by_intent", "amount": 200})
    assert (refund.charge, refund.payment_intent, refund.currency) == (charge, "pi_by_intent", "gbp")
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.refunds.create(params={"payment_intent": "pi_unknown", "amount": 1})
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")


class WebhookReceiver:
    """A local HTTP endpoint that keeps every POST it gets (body and Stripe-Signature)."""

    def __init__(self) -> None:
        import http.server

        received = self.received = list[tuple[str, str]]()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                received.append((body, self.headers.get("Stripe-Signature", "")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/webhooks/stripe"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 15) -> list[tuple[str, str]]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} webhooks arrived"
            time.sleep(0.05)
        return list(self.received)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    got = WebhookReceiver()
    yield got
    got.close()


def test_a_pending_refund_settles_later_with_a_webhook_signed_as_stripe_signs_it(
    start_sandbox: Callable[..., Sandbox], receiver: WebhookReceiver
) -> None:
    secret = "whsec_sandbox_test"
    sandbox = start_sandbox(webhook_url=receiver.url, webhook_secret=secret)
    client, charge = sandbox.stripe(), sandbox.charge(amount=1000)
    sandbox.set_faults(pending_next=1, pending_fail_next=1, settle_after_ms=200, failure_reason="lost_or_stolen_card")
    late = client.v1.refunds.create(params={"charge": charge, "amount": 300})
    failing = client.v1.refunds.create(params={"charge": charge, "amount": 700})
    assert (late.status, failing.status) == ("pending", "pending")
    assert client.v1.charges.retrieve(charge).amount_refunded == 1000  # pending refunds hold the charge
    events = [stripe.Webhook.construct_event(body, signature, secret) for body, signature in receiver.wait_for(2)]
    by_refund = {e.data.object.id: e for e in events}
    assert by_refund[late.id].type == "refund.updated" and by_refund[late.id].data.object.status == "succeeded"
    failed = by_refund[failing.id].data.object
    assert by_refund[failing.id].type == "refund.failed"
    assert (failed.status, failed.failure_reason) == ("failed", "lost_or_stolen_card")
    assert client.v1.refunds.retrieve(failing.id).status == "failed"
    assert client.v1.charges.retrieve(charge).amount_refunded == 300  # a failed refund gives the amount back
    with pytest.raises(stripe.SignatureVerificationError):
        body, signature = receiver.received[0]
        stripe.Webhook.construct_event(body, signature, "whsec_another")
    assert sandbox.stats()["refunds_failed"] == 1 and sandbox.stats()["events_delivered"] == 2


def test_a_pending_refund_can_be_settled_by_hand(sandbox: Sandbox) -> None:
    client, charge = sandbox.stripe(), sandbox.charge(amount=1000)
    sandbox.set_faults(pending_next=1, settle_after_ms=-1)
    refund = client.v1.refunds.create(params={"charge": charge, "amount": 1000})
    time.sleep(0.3)  # the settler ticks every 0.1 s; -1 means it leaves this one alone
    assert client.v1.refunds.retrieve(refund.id).status == "pending"
    with sandbox.http() as http:
        settled = http.post(f"/_sandbox/refunds/{refund.id}/settle", json={"status": "canceled"})
        assert settled.status_code == 200 and settled.json()["status"] == "canceled"
        assert http.post(f"/_sandbox/refunds/{refund.id}/settle", json={"status": "succeeded"}).status_code == 409
        events = http.get("/_sandbox/events").json()
    assert [(e["type"], e["data"]["object"]["id"], e["delivered"]) for e in events] == [
        ("refund.updated", refund.id, False)  # no webhook configured: kept, not sent
    ]
    assert client.v1.charges.retrieve(charge).amount_refunded == 0


def test_a_succeeded_refund_can_fail_afterwards_with_its_signed_refund_failed_event(
    start_sandbox: Callable[..., Sandbox], receiver: WebhookReceiver
) -> None:
    """Stripe lets a refund go ``succeeded`` -> ``failed`` (the bank returned it); tests make it happen by hand."""
    secret = "whsec_sandbox_reversal"
    sandbox = start_sandbox(webhook_url=receiver.url, webhook_secret=secret)
    client, charge = sandbox.stripe(), sandbox.charge(amount=1000)
    refund = client.v1.refunds.create(params={"charge": charge, "amount": 400, "metadata": {"refund_id": "r-1"}})
    assert refund.status == "succeeded"
    with sandbox.http() as http:
        failed = http.post(f"/_sandbox/refunds/{refund.id}/fail", json={"failure_reason": "expired_or_canceled_card"})
        assert failed.status_code == 200
        assert (failed.json()["status"], failed.json()["failure_reason"]) == ("failed", "expired_or_canceled_card")
        again = http.post(f"/_sandbox/refunds/{refund.id}/fail", json={"failure_reason": "declined"})
        assert again.status_code == 409  # only a succeeded refund can fail afterwards, once
        assert http.post("/_sandbox/refunds/re_missing/fail", json={}).status_code == 404
        assert http.post(f"/_sandbox/refunds/{refund.id}/fail", json={"failure_reason": "bored"}).status_code == 422
    [(body, signature)] = receiver.wait_for(1)
    event = stripe.Webhook.construct_event(body, signature, secret)
    assert event.type == "refund.failed"
    assert (event.data.object.id, event.data.object.status) == (refund.id, "failed")
    assert event.data.object.failure_reason == "expired_or_canceled_card"
    assert event.data.object.metadata["refund_id"] == "r-1"
    assert client.v1.refunds.retrieve(refund.id).status == "failed"
    assert client.v1.charges.retrieve(charge).amount_refunded == 0  # the charge has the amount back
    assert sandbox.stats()["refunds_failed"] == 1


def test_a_charge_with_an_open_dispute_refuses_a_refund_as_stripe_does(sandbox: Sandbox) -> None:
    """A chargeback holds the charge: Stripe answers 400 ``charge_disputed`` (saved for the key); an inquiry
    (``warning_*``) and a dispute already won leave the charge refundable."""
    client = sandbox.stripe()
    charged_back, inquired, won = (sandbox.charge(amount=5000) for _ in range(3))
    disputes = [
        {"charge": c, "amount": 5000, "currency": "usd", "reason": "fraudulent", "status": s, "created": {"days": -1}}
        for c, s in ((charged_back, "needs_response"), (inquired, "warning_needs_response"), (won, "won"))
    ]
    with sandbox.http() as http:
        http.put("/_sandbox/risk", json={"disputes": disputes}).raise_for_status()
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"charge": charged_back, "amount": 100}, options={"idempotency_key": "k-cb"})
    assert (refused.value.http_status, refused.value.code) == (400, "charge_disputed")
    with pytest.raises(stripe.InvalidRequestError) as replayed:
        client.v1.refunds.create(params={"charge": charged_back, "amount": 100}, options={"idempotency_key": "k-cb"})
    assert replayed.value.code == "charge_disputed" and replayed.value.headers is not None
    assert replayed.value.headers["idempotent-replayed"] == "true"
    assert sandbox.refunds_for(charged_back) == 0
    for refundable in (inquired, won):
        assert client.v1.refunds.create(params={"charge": refundable, "amount": 100}).status == "succeeded"
