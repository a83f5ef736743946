"""Refunds the provider settles later: ``pending`` then ``succeeded`` completes, ``pending`` then ``failed``
ends failed with Stripe's reason, its reservation released, no "sent" message, and operators alerted;
settled by the scheduled re-read or by a verified webhook, once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent import runtime
from agent.domain import RefundRequest
from agent.http.server import create_app
from agent.ops.processes import wait_for
from agent.status import FINAL, refund_status
from agent.submit import submit_refund
from sandbox.webhooks import sign
from steps import audit
from steps.seed import seed
from steps.store import app_db, orders, outbox, provider_events, refunds
from tests import web
from tests.capture import CaptureServer
from tests.conftest import API_KEY, Env
from tests.identities import HELPDESK
from tests.servers import ThreadedServer, bound_socket
from tests.test_workflow import running

WEBHOOK_SECRET = "whsec_lifecycle_test_at_least_32_bytes_long"
API_TOKEN = "lifecycle-api-token-at-least-32-bytes-long"
JSON = "application/json"


def submit(client: DBOSClient, key: str, order_id: str = "ord_1001") -> str:
    request = RefundRequest(order_id=order_id, message="The mouse stopped working.")
    return submit_refund(
        client, idempotency_key=key, requester=HELPDESK, request=request, app_version="0.1.0"
    ).refund_id


def phase(client: DBOSClient, refund_id: str) -> str | None:
    found = refund_status(client, refund_id)
    return None if found is None else str(found["status"])


def reached(client: DBOSClient, refund_id: str, wanted: str) -> dict[str, Any] | None:
    """The refund's status once it is ``wanted``; a final one counts once the run that ended it returned its outcome
    (the row turns final in the step that books it; the run may have a step left, e.g. the operators' alert)."""
    found = refund_status(client, refund_id)
    if found is None or found["status"] != wanted:
        return None
    return found if wanted not in FINAL or found["outcome"] is not None else None


def until(client: DBOSClient, refund_id: str, wanted: str, timeout: float = 90) -> dict[str, Any]:
    found = wait_for(lambda: reached(client, refund_id, wanted), timeout=timeout, what=f"refund {refund_id} {wanted}")
    assert found is not None
    return found


def row(refund_id: str) -> Any:
    with app_db().engine.connect() as conn:
        return conn.execute(sa.select(refunds).where(refunds.c.refund_id == refund_id)).one()


def refunded_minor(order_id: str) -> int:
    with app_db().engine.connect() as conn:
        query = sa.select(orders.c.amount_refunded_minor).where(orders.c.order_id == order_id)
        return int(conn.execute(query).scalar_one())


def messages(refund_id: str) -> list[tuple[str, str]]:
    with app_db().engine.connect() as conn:
        query = sa.select(outbox.c.channel, outbox.c.body).where(outbox.c.refund_id == refund_id)
        return [(str(r.channel), str(r.body)) for r in conn.execute(query)]


def chain_ok() -> bool:
    with app_db().engine.connect() as conn:
        return audit.verify(conn).ok


@pytest.fixture
def slack() -> Iterator[CaptureServer]:
    with CaptureServer() as capture:
        yield capture


@pytest.fixture
def rechecking(env: Env, slack: CaptureServer) -> Iterator[DBOSClient]:
    """A worker in this process that re-reads a refund the provider has not settled every half second."""
    with running(env, payment_recheck_seconds=0.5, slack_webhook_url=slack.url("webhook")) as client:
        yield client


def test_pending_then_failed_ends_failed_with_the_reason_released_unsent_and_alerted(
    env: Env, rechecking: DBOSClient, slack: CaptureServer
) -> None:
    env.sandbox.set_faults(pending_fail_next=1, settle_after_ms=400, failure_reason="expired_or_canceled_card")
    refund_id = submit(rechecking, "life-failed-0001")
    ended = until(rechecking, refund_id, "failed")
    assert ended["outcome"]["failure_reason"] == "expired_or_canceled_card"
    assert (ended["payment"]["provider_status"], ended["payment"]["failure_reason"]) == (
        "failed",
        "expired_or_canceled_card",
    )  # what GET /refunds/{id} and the console show
    settled = row(refund_id)
    assert (settled.provider_status, settled.provider_failure_reason) == ("failed", "expired_or_canceled_card")
    assert settled.reserved_amount_minor is None  # the reservation is released: the order is refundable again
    assert refunded_minor("ord_1001") == 0
    [held] = env.sandbox.refunds("ch_ord_1001")
    assert (held["id"], held["status"]) == (settled.provider_refund_id, "failed")
    sent = messages(refund_id)
    assert not [body for channel, body in sent if channel == "email"]  # the customer is never told it was sent
    [alert] = [body for channel, body in sent if channel == "operators"]
    assert refund_id in alert and "expired_or_canceled_card" in alert
    [posted] = wait_for(lambda: slack.received("webhook") or None, timeout=30, what="the operators' Slack alert")
    assert refund_id in posted["text"] and "expired_or_canceled_card" in posted["text"]  # and on Slack
    assert posted["mrkdwn"] is False and posted["unfurl_links"] is False  # as written, never a link preview
    assert env.sandbox.stats()["create_requests"] == 1
    assert chain_ok()


def test_pending_then_succeeded_completes_and_books_the_order_once(env: Env, rechecking: DBOSClient) -> None:
    env.sandbox.set_faults(pending_next=1, settle_after_ms=400)
    refund_id = submit(rechecking, "life-paid-00001")
    wait_for(lambda: row(refund_id).status in ("settling", "completed"), timeout=90, what="the refund to be paid")
    ended = until(rechecking, refund_id, "completed")
    assert ended["outcome"]["provider_status"] == "succeeded"
    assert refunded_minor("ord_1001") == 4200 and row(refund_id).reserved_amount_minor is None
    [held] = env.sandbox.refunds("ch_ord_1001")
    assert held["status"] == "succeeded" and held["id"] == row(refund_id).provider_refund_id
    [(channel, body)] = messages(refund_id)
    assert channel == "email" and "sent" in body
    assert chain_ok()


def finished(client: DBOSClient, workflow_id: str) -> Any:
    """The workflow's output once it succeeded (None before)."""
    found = client.list_workflows(workflow_ids=[workflow_id], load_output=True)
    return found[0].output if found and found[0].status == "SUCCESS" else None


def provider_events_of(refund_id: str) -> list[Any]:
    with app_db().engine.connect() as conn:
        query = sa.select(provider_events).where(provider_events.c.refund_id == refund_id)
        return list(conn.execute(query.order_by(provider_events.c.received_at)))


def test_a_reread_that_sees_pending_leaves_the_refund_settling_books_nothing_and_checks_again(
    env: Env, rechecking: DBOSClient
) -> None:
    env.sandbox.set_faults(pending_next=1, settle_after_ms=-1)  # pending until settled by hand
    refund_id = submit(rechecking, "life-reread-0001")
    check = f"{refund_id}/payment-check-1"
    first = wait_for(lambda: finished(rechecking, check), timeout=90, what="the first re-read")
    assert first == {"refund_id": refund_id, "status": "settling", "provider_status": "pending"}
    [following] = rechecking.list_workflows(workflow_ids=[f"{refund_id}/payment-check-2"])  # it scheduled the next
    assert following.name == "payment_check_workflow"
    waiting = row(refund_id)
    assert (waiting.status, waiting.provider_status, waiting.reserved_amount_minor) == ("settling", "pending", 4200)
    assert refunded_minor("ord_1001") == 0 and messages(refund_id) == []  # nothing booked, nobody told
    assert phase(rechecking, refund_id) == "settling"
    settle_at_sandbox(env, waiting.provider_refund_id, "succeeded")  # no webhook here: only a re-read learns it
    ended = until(rechecking, refund_id, "completed")
    assert ended["outcome"]["provider_status"] == "succeeded"
    assert refunded_minor("ord_1001") == 4200 and row(refund_id).reserved_amount_minor is None
    checks = rechecking.list_workflows(workflow_id_prefix=f"{refund_id}/payment-check-", load_output=True)
    [settler] = [wf for wf in checks if isinstance(wf.output, dict) and wf.output.get("status") == "completed"]
    assert settler.workflow_id != check  # a later re-read, once the provider said succeeded
    [(channel, body)] = messages(refund_id)
    assert channel == "email" and "sent" in body
    [recorded] = provider_events_of(refund_id)  # a re-read that only saw pending records nothing
    assert (recorded.event_key, recorded.source, recorded.outcome, recorded.reason) == (
        settler.workflow_id,
        "recheck",
        "accepted",
        "succeeded",
    )
    assert chain_ok()


@pytest.fixture
def served(env: Env) -> Iterator[tuple[ThreadedServer, DBOSClient]]:
    """The service over HTTP (API + worker) with a webhook secret; re-reads far apart, so webhooks settle."""
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    settings = env.settings(
        refund_agent_port=port,
        refund_agent_api_token=API_TOKEN,
        stripe_webhook_secret=WEBHOOK_SECRET,
        payment_recheck_seconds=3600,
    )
    server = ThreadedServer(create_app(settings, freeze_heap=False), sock=sock)
    server.start()
    seed(app_db().engine)  # the embedded default seeds itself; Postgres does not
    client = runtime.client(settings)
    with web.client(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        target = {"url": f"{server.base_url}/webhooks/stripe", "secret": WEBHOOK_SECRET}
        http.put(f"{env.sandbox.base_url}/_sandbox/webhook", json=target).raise_for_status()
    try:
        yield server, client
    finally:
        client.destroy()
        server.stop()


def settle_at_sandbox(env: Env, provider_refund_id: str, status: str, reason: str | None = None) -> None:
    body = {"status": status, "failure_reason": reason}
    with web.client(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        http.post(f"{env.sandbox.base_url}/_sandbox/refunds/{provider_refund_id}/settle", json=body).raise_for_status()


@pytest.mark.parametrize("final", ["succeeded", "failed"])
def test_a_verified_webhook_settles_a_pending_refund(
    env: Env, served: tuple[ThreadedServer, DBOSClient], final: str
) -> None:
    server, client = served
    env.sandbox.set_faults(pending_next=1, settle_after_ms=-1)  # pending until settled by hand
    refund_id = submit(client, f"life-hook-{final}")
    parked = until(client, refund_id, "settling")
    assert parked["status"] == "settling" and refunded_minor("ord_1001") == 0
    provider_refund_id = row(refund_id).provider_refund_id
    settle_at_sandbox(env, provider_refund_id, final, "insufficient_funds" if final == "failed" else None)
    ended = until(client, refund_id, "completed" if final == "succeeded" else "failed", timeout=30)
    assert ended["outcome"]["provider_status"] == final
    assert refunded_minor("ord_1001") == (4200 if final == "succeeded" else 0)
    events = web.get(f"{env.sandbox.base_url}/_sandbox/events", headers={"Authorization": f"Bearer {API_KEY}"})
    event = {k: v for k, v in events.json()[-1].items() if k not in ("attempts", "delivered")}
    wf_ids = {wf.workflow_id for wf in client.list_workflows(workflow_id_prefix=f"{refund_id}/payment-")}
    assert f"{refund_id}/payment-event-{event['id']}" in wf_ids  # the webhook's settlement, not a re-read
    # The same event again (Stripe retries) settles nothing twice.
    payload = json.dumps(event)
    headers = {"Stripe-Signature": sign(payload, WEBHOOK_SECRET, int(time.time())), "Content-Type": JSON}
    again = web.post(f"{server.base_url}/webhooks/stripe", content=payload, headers=headers)
    assert again.status_code == 200 and again.json()["handled"] is False
    assert len([b for c, b in messages(refund_id) if c == "email"]) == (1 if final == "succeeded" else 0)
    assert chain_ok()


def test_a_webhook_without_a_valid_signature_is_refused_and_changes_nothing(
    env: Env, served: tuple[ThreadedServer, DBOSClient]
) -> None:
    server, client = served
    env.sandbox.set_faults(pending_next=1, settle_after_ms=-1)
    refund_id = submit(client, "life-forged-0001")
    until(client, refund_id, "settling")
    provider_refund_id = row(refund_id).provider_refund_id
    forged = {
        "id": "evt_forged",
        "object": "event",
        "type": "refund.updated",
        "data": {
            "object": {
                "id": provider_refund_id,
                "object": "refund",
                "status": "succeeded",
                "metadata": {"refund_id": refund_id},
            }
        },
    }
    payload = json.dumps(forged)
    for headers in (
        {},
        {"Stripe-Signature": sign(payload, "whsec_someone_else", int(time.time()))},
        {"Stripe-Signature": sign(payload, WEBHOOK_SECRET, int(time.time()) - 3600)},  # stale
    ):
        refused = web.post(
            f"{server.base_url}/webhooks/stripe", content=payload, headers=headers | {"Content-Type": JSON}
        )
        assert refused.status_code == 401, headers
    time.sleep(0.5)  # nothing may happen: give a wrongly enqueued settlement the time to show
    assert phase(client, refund_id) == "settling" and refunded_minor("ord_1001") == 0
    assert Decimal(env.sandbox.refunds("ch_ord_1001")[0]["amount"]) == 4200
