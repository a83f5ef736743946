"""Schemathesis against our own OpenAPI: no generated input makes the service answer 5xx.

The real app (``create_app``: DBOS launched in its lifespan, a worker in process, the seeded SQLite
databases of the ``env`` fixture, its payments sandbox) runs under uvicorn in a thread, one service
per API operation; Schemathesis generates requests from the app's OpenAPI document (examples,
coverage and fuzzing phases, valid and invalid data) and sends them over HTTP. Only the SQLite
backend: the input handling is the same code on Postgres, and it keeps this file fast. What the
fuzzer cannot reach on its own (real orders, genuinely signed approval tokens) gets its own sweep.

Checks: no 5xx; a 2xx body conforms to its documented schema; the refund routes answer nothing but
an error without the API token. Server errors found this way stay as regression tests at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, CheckFunction, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from agent import runtime, tokens
from agent.http.server import create_app
from agent.ops.processes import wait_for
from agent.settings import Settings
from steps.records import SUPPORTED_CURRENCIES
from steps.seed import ORDERS
from steps.store import create_engine
from tests import web
from tests.conftest import BACKENDS, Env
from tests.identities import APPROVER_CLIENT, add_approver_client
from tests.servers import ThreadedServer, bound_socket

TOKEN = "test-token-of-the-helpdesk-client-0001"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APPROVER_KEY = "test-key-of-the-approvals-desk-0001"
SIGNING_SECRET = "test-secret-of-approval-links-0001"
SLACK_SECRET = "test-slack-signing-secret-00000001"  # configured, so /slack/interactions runs its verification

#: Operations behind an API client's key; the link and Slack routes carry their own proof.
GUARDED = {
    ("POST", "/refunds"),
    ("GET", "/refunds"),
    ("GET", "/refunds/{refund_id}"),
    ("GET", "/orders"),
    ("POST", "/refunds/{refund_id}/approval"),
}

# The document only: building the app starts nothing (DBOS launches in the lifespan).
DOCUMENT = create_app(Settings()).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)


def _without_examples(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_examples(v) for k, v in node.items() if k not in ("example", "examples")}
    if isinstance(node, list):
        return [_without_examples(v) for v in node]
    return node


#: For sweeps that draw some values themselves (``@schema.given``), which Schemathesis cannot combine with
#: the document's examples; ``schema`` exercises those.
drawn_schema = schemathesis.openapi.from_dict(_without_examples(DOCUMENT))

sqlite_only = pytest.mark.parametrize("env", ["sqlite"], indirect=True)
# Schemathesis's own case strategies draw from `random`; nothing here to act on.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")


def bounded(max_examples: int) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # no example database under the repository
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,  # one service per operation, shared by its examples on purpose
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


class Service(ThreadedServer):
    """``create_app`` under uvicorn in a thread; leaving runs the lifespan's shutdown (DBOS destroyed)."""

    def __init__(self, env: Env) -> None:
        sock = bound_socket()
        port = int(sock.getsockname()[1])
        settings = env.settings(
            refund_agent_api_token=TOKEN,
            approval_signing_secret=SIGNING_SECRET,
            slack_signing_secret=SLACK_SECRET,
            refund_agent_port=port,
        )
        runtime.migrate_databases(settings)
        engine = create_engine(settings.database.app_database_url)
        try:
            add_approver_client(engine, APPROVER_KEY)
        finally:
            engine.dispose()
        super().__init__(create_app(settings, freeze_heap=False), sock=sock)

    def __enter__(self) -> Service:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        with suppress(httpx.HTTPError):  # a service that is down already has nothing to settle
            wait_for(self._none_waiting, timeout=60, what="refunds waiting for approval to be rejected")
        self.stop()

    def _none_waiting(self) -> bool:
        """Reject, through the API, refunds parked for approval: they would hold shutdown for its drain timeout."""
        with web.client(base_url=self.base_url, headers=AUTH, timeout=30) as http:
            listing = http.get("/refunds", params={"status": "awaiting_approval", "limit": 100})
            if listing.status_code != 200:  # the test has failed already; shutdown's drain timeout bounds the rest
                return True
            waiting = listing.json()["items"]
            for item in waiting:
                refund_id = item["refund_id"]
                approver = {"Authorization": f"Bearer {APPROVER_KEY}"}
                requested = (http.get(f"/refunds/{refund_id}").json().get("approval") or {}).get("request")
                if requested:
                    decision = {"decision": "reject", "amount": requested["amount"], "currency": requested["currency"]}
                    http.post(f"/refunds/{refund_id}/approval", json=decision, headers=approver)
        return not waiting


@pytest.fixture
def service_url(env: Env) -> Iterator[str]:
    with Service(env) as service:
        yield service.base_url


def success_conforms(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """A 2xx body matches its documented schema (errors are RFC 9457 problems, not FastAPI's 422 shape)."""
    if 200 <= response.status_code < 300:
        return response_schema_conformance(ctx, response, case)
    return None


CHECKS: list[CheckFunction] = [not_a_server_error, success_conforms]


@sqlite_only
@schema.parametrize()
@bounded(30)
def test_generated_requests_never_get_a_server_error(case: Case[Any], service_url: str) -> None:
    """Every operation, with the API token and then with whatever Authorization header was generated."""
    case.call_and_validate(base_url=service_url, headers=AUTH, checks=CHECKS)
    anonymous = case.call_and_validate(base_url=service_url, checks=[not_a_server_error])
    if (case.method.upper(), case.path) in GUARDED:
        assert not 200 <= anonymous.status_code < 300, f"{case.method} {case.formatted_path} answered without a token"


ORDER_IDS = [order[0] for order in ORDERS]
#: A few keys only, so examples reuse them: replays (same body) and conflicts (another body) happen too.
KEYS = [f"fuzz-refund-{i:04d}" for i in range(6)]


@sqlite_only
@drawn_schema.include(method="POST", path="/refunds").parametrize()
@drawn_schema.given(order_id=st.sampled_from(ORDER_IDS), key=st.sampled_from(KEYS))
@bounded(40)
def test_refund_requests_on_real_orders_never_get_a_server_error(
    case: Case[Any], order_id: str, key: str, service_url: str
) -> None:
    """Generated bodies on the seeded orders with a valid Idempotency-Key: they reach ``submit_refund``."""
    if isinstance(case.body, dict):
        case.body["order_id"] = order_id
    case.call_and_validate(base_url=service_url, headers={**AUTH, "Idempotency-Key": key}, checks=CHECKS)


PENDING = "fuzz-pending-0001"  # a 4,200.00 USD refund on ord_1002: above the auto-approve limit, it waits


@pytest.fixture
def pending_refund(service_url: str) -> str:
    body = {"order_id": "ord_1002", "message": "Everything arrived broken."}
    response = web.post(f"{service_url}/refunds", json=body, headers={**AUTH, "Idempotency-Key": PENDING}, timeout=30)
    assert response.status_code == 202, response.text

    def parked() -> bool:
        status = web.get(f"{service_url}/refunds/{PENDING}", headers=AUTH, timeout=30).json()
        return bool(status["status"] == "awaiting_approval")

    wait_for(parked, timeout=60, what="the refund to wait for approval")
    return PENDING


#: Claims our service could have signed: a refund (the pending one, or one that is not waiting), an
#: amount and currency (the ones it waits for, or others), an expiry in the past or the future.
CLAIMS = st.builds(
    tokens.ApprovalClaims,
    refund_id=st.one_of(st.just(PENDING), st.from_regex(r"\A[A-Za-z0-9_.:-]{8,40}\Z")),
    amount=st.one_of(st.just(Decimal("4200.00")), st.decimals(min_value=0, max_value=10**9, places=2, allow_nan=False)),
    currency=st.sampled_from(sorted(SUPPORTED_CURRENCIES)),
    expires_at=st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    approver=st.one_of(
        st.sampled_from(["operator:admin", "slack", f"client:{APPROVER_CLIENT}", "client:default"]),
        st.text(max_size=40),
    ),
)


@sqlite_only
@drawn_schema.include(path_regex="approv").parametrize()
@drawn_schema.given(claims=CLAIMS)
@bounded(25)
def test_signed_approval_tokens_never_get_a_server_error(
    case: Case[Any], claims: tokens.ApprovalClaims, pending_refund: str, service_url: str
) -> None:
    """The approval routes with genuinely signed tokens, so requests get past the signature check (and, with the
    approvals desk's key, past the API's client check)."""
    token = tokens.sign(claims, SIGNING_SECRET.encode())
    if case.path_parameters is not None:
        if "token" in case.path_parameters:
            case.path_parameters["token"] = token
        if "refund_id" in case.path_parameters:
            case.path_parameters["refund_id"] = claims.refund_id
    case.call_and_validate(base_url=service_url, headers={"Authorization": f"Bearer {APPROVER_KEY}"}, checks=CHECKS)


# Server errors found by fuzzing and probing, fixed; kept as regression tests.

NUL_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/refunds/%00", {}),
    ("/orders", {"cursor": "\x00"}),
    # a cursor as the API makes them (urlsafe base64 of [created_at, refund_id]) whose refund id holds a NUL
    ("/refunds", {"cursor": "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgImFcdTAwMDAiXQ=="}),
]


@pytest.mark.skipif("postgres" not in BACKENDS, reason="REFUND_AGENT_TEST_POSTGRES_URL=off")
@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_nul_characters_in_ids_and_cursors_are_not_a_server_error_on_postgres(service_url: str) -> None:
    answers = {
        path + str(params): web.get(service_url + path, params=params, headers=AUTH, timeout=30).status_code
        for path, params in NUL_REQUESTS
    }
    assert all(status < 500 for status in answers.values()), answers


@sqlite_only
@pytest.mark.parametrize("timestamp", [None, "not-a-number"])
def test_slack_request_without_a_numeric_timestamp_is_refused_not_a_crash(
    timestamp: str | None, service_url: str
) -> None:
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Signature": "v0=00"}
    if timestamp is not None:
        headers["X-Slack-Request-Timestamp"] = timestamp
    response = web.post(f"{service_url}/slack/interactions", content=b"payload=%7B%7D", headers=headers, timeout=30)
    assert response.status_code == 401, response.text


def test_the_document_states_the_input_rules_a_client_must_follow() -> None:
    """The Idempotency-Key's pattern and the amount as a decimal string are in the schema, with examples."""
    document = DOCUMENT
    post = document["paths"]["/refunds"]["post"]
    key = next(p for p in post["parameters"] if p["name"] == "Idempotency-Key")
    assert key["schema"]["pattern"] == r"^[A-Za-z0-9_.:-]{8,200}$" and "8-200" in key["description"]
    assert key["required"] is True
    amount = document["components"]["schemas"]["RefundIn"]["properties"]["amount"]
    assert amount["examples"] == ["42.50"] and "decimal string" in amount["description"]
    assert {"type": "string"} in amount["anyOf"] and {"type": "number"} not in amount["anyOf"]
    assert amount["pattern"] == r"^[0-9]{1,12}(\.[0-9]{1,3})?$"  # 3: KWD's decimals; the order's currency decides
