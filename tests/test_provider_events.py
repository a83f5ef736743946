"""A provider's event changes a refund only when the provider refund it names is the one the refund's row holds
(same id, metadata base key, amount, currency and charge); the settlement re-reads that refund from the provider
and judges it again before booking. Anything else changes nothing, is recorded with its reason and counted in
/metrics. A paid refund the provider fails afterwards is reversed once: failed, its amount released, operators
alerted. Signed events here are forged with the endpoint's own secret, as an attacker holding it would."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from prometheus_client.parser import text_string_to_metric_families

from agent import runtime
from agent.console import actions
from agent.http.server import create_app
from agent.ops.processes import wait_for
from agent.settlement import event_options, event_workflow_id
from agent.workflow import REFUND_QUEUE
from sandbox.webhooks import sign
from steps.payments import fetch_refund, idempotency_key
from steps.provider_events import ProviderEvent
from steps.seed import seed
from steps.settlement import reverse_payment_step, settle_payment_step
from steps.store import app_db, audit_log, provider_events
from tests import web
from tests.capture import CaptureServer
from tests.conftest import API_KEY, Env
from tests.servers import ThreadedServer, bound_socket
from tests.test_refund_lifecycle import (
    chain_ok,
    finished,
    messages,
    refunded_minor,
    row,
    settle_at_sandbox,
    submit,
    until,
)

WEBHOOK_SECRET = "whsec_provider_events_test_at_least_32_bytes"
SANDBOX = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Service:
    env: Env
    server: ThreadedServer
    client: DBOSClient
    slack: CaptureServer

    def post_event(self, event_type: str, refund: dict[str, Any], event_id: str | None = None) -> httpx.Response:
        """A Stripe event about ``refund``, signed with the endpoint's secret, posted to our webhook."""
        event = {
            "id": event_id or f"evt_{secrets.token_hex(12)}",
            "object": "event",
            "type": event_type,
            "created": int(time.time()),
            "data": {"object": refund},
        }
        return self.post_signed(json.dumps(event))

    def post_signed(self, payload: str) -> httpx.Response:
        headers = {
            "Stripe-Signature": sign(payload, WEBHOOK_SECRET, int(time.time())),
            "Content-Type": "application/json",
        }
        response = web.post(f"{self.server.base_url}/webhooks/stripe", content=payload, headers=headers)
        assert response.status_code == 200, response.text
        return response

    def provider_refund(self, provider_refund_id: str) -> dict[str, Any]:
        """The refund as the provider holds it (what a genuine event would carry)."""
        found = web.get(f"{self.env.sandbox.base_url}/v1/refunds/{provider_refund_id}", headers=SANDBOX)
        found.raise_for_status()
        return dict(found.json())

    def refund_elsewhere(self, refund_id: str, *, charge: str, amount: int) -> dict[str, Any]:
        """Another provider refund whose metadata names our refund (and its base key), on another charge."""
        params = {
            "charge": charge,
            "amount": str(amount),
            "metadata[refund_id]": refund_id,
            "metadata[order_id]": "ord_1001",
            "metadata[idempotency_key]": idempotency_key(refund_id, "ord_1001"),
        }
        made = web.post(f"{self.env.sandbox.base_url}/v1/refunds", data=params, headers=SANDBOX)
        made.raise_for_status()
        return dict(made.json())

    def metric(self, **labels: str) -> float:
        """``refund_agent_provider_events_total`` for these labels, as /metrics serves it (0 when absent)."""
        text = web.get(f"{self.server.base_url}/metrics").text
        for family in text_string_to_metric_families(text):
            if family.name == "refund_agent_provider_events":
                for sample in family.samples:
                    if sample.name.endswith("_total") and sample.labels == labels:
                        return float(sample.value)
        return 0.0

    def settlements(self, refund_id: str) -> list[str]:
        found = self.client.list_workflows(workflow_id_prefix=f"{refund_id}/payment-event-", load_input=False)
        return [wf.workflow_id for wf in found]


@pytest.fixture
def svc(env: Env) -> Iterator[Service]:
    """The service over HTTP (API + worker) taking signed webhooks; re-reads far apart, so events settle."""
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    with CaptureServer() as slack:
        settings = env.settings(
            refund_agent_port=port,
            stripe_webhook_secret=WEBHOOK_SECRET,
            payment_recheck_seconds=3600,
            slack_webhook_url=slack.url("webhook"),
        )
        server = ThreadedServer(create_app(settings, freeze_heap=False), sock=sock)
        server.start()
        seed(app_db().engine)
        client = runtime.client(settings)
        target = {"url": f"{server.base_url}/webhooks/stripe", "secret": WEBHOOK_SECRET}
        web.put(f"{env.sandbox.base_url}/_sandbox/webhook", json=target, headers=SANDBOX).raise_for_status()
        try:
            yield Service(env, server, client, slack)
        finally:
            client.destroy()
            server.stop()


def recorded(event_key: str) -> tuple[str, str, str | None] | None:
    """(outcome, reason, refund id) recorded for the provider event, or None."""
    with app_db().engine.connect() as conn:
        found = conn.execute(sa.select(provider_events).where(provider_events.c.event_key == event_key)).one_or_none()
    return None if found is None else (found.outcome, found.reason, found.refund_id)


def audit_events(refund_id: str) -> list[str]:
    with app_db().engine.connect() as conn:
        query = sa.select(audit_log.c.event).where(audit_log.c.refund_id == refund_id).order_by(audit_log.c.seq)
        return [str(event) for event in conn.execute(query).scalars()]


def alerts(refund_id: str) -> list[str]:
    return [body for channel, body in messages(refund_id) if channel == "operators"]


def settling(svc: Service, key: str) -> tuple[str, dict[str, Any]]:
    """A refund the provider left pending (until settled by hand), and its provider refund as the provider holds it."""
    svc.env.sandbox.set_faults(pending_next=1, settle_after_ms=-1)
    refund_id = submit(svc.client, key)
    until(svc.client, refund_id, "settling")
    return refund_id, svc.provider_refund(row(refund_id).provider_refund_id)


def test_an_event_naming_another_provider_refund_changes_nothing_and_is_rejected_and_counted(svc: Service) -> None:
    refund_id, ours = settling(svc, "prov-other-0001")
    other = svc.refund_elsewhere(refund_id, charge="ch_ord_1002", amount=25000)  # 250.00 on another order's charge
    answer = svc.post_event("refund.updated", other, event_id="evt_other_refund_1")
    assert (answer.json()["handled"], answer.json()["reason"]) == (False, "other_provider_refund")
    assert recorded("evt_other_refund_1") == ("rejected", "other_provider_refund", refund_id)
    assert svc.metric(source="webhook", outcome="rejected", reason="other_provider_refund") == 1
    assert svc.settlements(refund_id) == []  # nothing was enqueued

    # An event an older release's webhook enqueued with the other refund's id: the settlement reads the refund
    # the row holds (still pending), not the one the event names.
    options = event_options(refund_id, "evt_older_release_1")
    svc.client.enqueue(options, refund_id, other["id"])
    done = wait_for(lambda: finished(svc.client, options["workflow_id"]), timeout=60, what="the older event's run")
    assert (done["status"], done["reason"]) == ("unchanged", "not_final")
    assert recorded(options["workflow_id"]) == ("ignored", "not_final", refund_id)

    # The settlement step itself judges what it is given against the row, under the row's lock.
    note = ProviderEvent(
        key="evt_direct_settle_1", source="webhook", event_type="refund.updated", provider_refund_id=other["id"]
    )
    assert not settle_payment_step(refund_id, fetch_refund(other["id"], ""), notify=None, alert=None, event=note)
    assert recorded("evt_direct_settle_1") == ("rejected", "other_provider_refund", refund_id)

    # A forged refund.failed naming our own provider refund: the provider (re-read) says pending.
    forged = ours | {"status": "failed", "failure_reason": "expired_or_canceled_card"}
    assert svc.post_event("refund.failed", forged, event_id="evt_forged_failed_1").json()["handled"] is True
    run = event_workflow_id(refund_id, "evt_forged_failed_1")
    done = wait_for(lambda: finished(svc.client, run), timeout=60, what="the forged event's run")
    assert (done["status"], done["reason"]) == ("unchanged", "provider_disagrees")
    assert recorded("evt_forged_failed_1") == ("ignored", "provider_disagrees", refund_id)

    waiting = row(refund_id)
    assert (waiting.status, waiting.reserved_amount_minor, waiting.provider_refund_id) == ("settling", 4200, ours["id"])
    assert refunded_minor("ord_1001") == 0 and refunded_minor("ord_1002") == 0 and alerts(refund_id) == []
    settle_at_sandbox(svc.env, ours["id"], "succeeded")  # the genuine event settles it, with our refund's amount
    until(svc.client, refund_id, "completed", timeout=60)
    assert refunded_minor("ord_1001") == 4200 and refunded_minor("ord_1002") == 0
    assert chain_ok()


def test_an_event_that_differs_from_the_row_in_id_key_charge_amount_or_currency_is_rejected(svc: Service) -> None:
    refund_id, ours = settling(svc, "prov-fields-0001")
    paid = ours | {"status": "succeeded"}
    metadata = ours["metadata"] | {"idempotency_key": idempotency_key(refund_id, "ord_1002")}
    forgeries = {
        "other_provider_refund": paid | {"id": f"re_{secrets.token_hex(12)}"},
        "other_idempotency_key": paid | {"metadata": metadata},
        "other_charge": paid | {"charge": "ch_ord_1002"},
        "other_amount": paid | {"amount": 25000},
        "other_currency": paid | {"currency": "eur"},
    }
    for expected, forged in forgeries.items():
        answer = svc.post_event("refund.updated", forged, event_id=f"evt_{expected}")
        reason = "other_amount" if expected == "other_currency" else expected
        assert (answer.json()["handled"], answer.json()["reason"]) == (False, reason), expected
        assert recorded(f"evt_{expected}") == ("rejected", reason, refund_id)
    assert svc.metric(source="webhook", outcome="rejected", reason="other_amount") == 2
    assert svc.settlements(refund_id) == []
    # The same event with nothing altered is taken, and changes nothing either: the provider says pending.
    assert svc.post_event("refund.updated", paid, event_id="evt_unaltered_1").json()["handled"] is True
    [run] = svc.settlements(refund_id)
    done = wait_for(lambda: finished(svc.client, run), timeout=60, what="the unaltered event's run")
    assert done["reason"] == "provider_disagrees"
    assert row(refund_id).status == "settling" and refunded_minor("ord_1001") == 0


def test_an_event_while_the_refund_is_being_paid_changes_nothing(svc: Service) -> None:
    refund_id = "prov-paying-0001"
    other = svc.refund_elsewhere(refund_id, charge="ch_ord_1002", amount=25000)
    svc.env.sandbox.set_faults(latency_ms=6000)  # the payment call is slow: the row stays `paying` meanwhile
    submit(svc.client, refund_id)
    wait_for(lambda: row(refund_id).status == "paying", timeout=60, what="the refund to be paying")
    attack = svc.post_event("refund.updated", other, event_id="evt_while_paying_1")
    assert (attack.json()["handled"], attack.json()["reason"]) == (False, "other_charge")
    assert recorded("evt_while_paying_1") == ("rejected", "other_charge", refund_id)
    # Even one about the payment being made (our key, charge and amount) waits for the paying workflow.
    ours = {
        "id": f"re_{secrets.token_hex(12)}",
        "object": "refund",
        "amount": 4200,
        "currency": "usd",
        "charge": "ch_ord_1001",
        "status": "succeeded",
        "metadata": {"refund_id": refund_id, "idempotency_key": idempotency_key(refund_id, "ord_1001")},
    }
    early = svc.post_event("refund.updated", ours, event_id="evt_while_paying_2")
    assert (early.json()["handled"], early.json()["reason"]) == (False, "still_paying")
    assert recorded("evt_while_paying_2") == ("ignored", "still_paying", refund_id)
    assert svc.settlements(refund_id) == []
    options = event_options(refund_id, "evt_older_release_2")  # as an older release's webhook enqueued it
    svc.client.enqueue(options, refund_id, other["id"])
    done = wait_for(lambda: finished(svc.client, options["workflow_id"]), timeout=60, what="the older event's run")
    assert done["status"] == "settled" and recorded(options["workflow_id"]) == ("ignored", "still_paying", refund_id)
    assert row(refund_id).status == "paying", "the payment ended before the events were judged: raise the latency"
    until(svc.client, refund_id, "completed", timeout=90)
    [held] = svc.env.sandbox.refunds("ch_ord_1001")
    assert row(refund_id).provider_refund_id == held["id"] != other["id"]
    assert refunded_minor("ord_1001") == 4200 and refunded_minor("ord_1002") == 0
    assert svc.metric(source="webhook", outcome="ignored", reason="still_paying") == 2
    assert chain_ok()


def test_a_failed_event_for_a_refund_the_provider_paid_changes_nothing(svc: Service) -> None:
    refund_id = submit(svc.client, "prov-paid-00001")
    until(svc.client, refund_id, "completed")
    paid = svc.provider_refund(row(refund_id).provider_refund_id)
    forged = paid | {"status": "failed", "failure_reason": "insufficient_funds"}
    assert svc.post_event("refund.failed", forged, event_id="evt_paid_failed_1").json()["handled"] is True
    [run] = svc.settlements(refund_id)
    done = wait_for(lambda: finished(svc.client, run), timeout=60, what="the forged event's run")
    assert (done["status"], done["reason"], done["provider_status"]) == ("unchanged", "provider_disagrees", "succeeded")
    assert recorded("evt_paid_failed_1") == ("ignored", "provider_disagrees", refund_id)
    assert row(refund_id).status == "completed" and refunded_minor("ord_1001") == 4200
    assert alerts(refund_id) == [] and "refund_reversed" not in audit_events(refund_id)
    assert svc.slack.received("webhook") == []
    until(svc.client, refund_id, "completed")  # and GET /refunds/{id} still says so


def test_a_refund_that_fails_after_it_succeeded_is_reversed_once_released_and_alerted(svc: Service) -> None:
    refund_id = submit(svc.client, "prov-reversed-01")
    until(svc.client, refund_id, "completed")
    provider_refund_id = row(refund_id).provider_refund_id
    assert refunded_minor("ord_1001") == 4200
    failed = web.post(
        f"{svc.env.sandbox.base_url}/_sandbox/refunds/{provider_refund_id}/fail",
        json={"failure_reason": "expired_or_canceled_card"},
        headers=SANDBOX,
    )
    failed.raise_for_status()  # the sandbox sends the signed refund.failed to our webhook
    ended = until(svc.client, refund_id, "failed", timeout=60)
    assert ended["outcome"]["reversed"] is True
    assert (ended["outcome"]["failure_reason"], ended["outcome"]["amount"]) == ("expired_or_canceled_card", "42.00")
    reversed_row = row(refund_id)
    assert (reversed_row.provider_status, reversed_row.provider_failure_reason) == (
        "failed",
        "expired_or_canceled_card",
    )
    assert refunded_minor("ord_1001") == 0  # the order is refundable again
    [alert] = alerts(refund_id)
    assert refund_id in alert and "expired_or_canceled_card" in alert and "told it was paid" in alert
    [posted] = wait_for(lambda: svc.slack.received("webhook") or None, timeout=30, what="the Slack alert")
    assert refund_id in posted["text"] and "told it was paid" in posted["text"]
    [event] = [e for e in web.get(f"{svc.env.sandbox.base_url}/_sandbox/events", headers=SANDBOX).json()]
    assert recorded(event["id"]) == ("accepted", "reversed", refund_id)

    # Delivered again, and again as another event (Stripe sends refund.updated too): nothing more happens.
    again = svc.post_signed(json.dumps({k: v for k, v in event.items() if k not in ("attempts", "delivered")}))
    assert (again.json()["handled"], again.json()["reason"]) == (False, "already_settled")
    updated = svc.post_event("refund.updated", event["data"]["object"], event_id="evt_reversal_updated")
    assert (updated.json()["handled"], updated.json()["reason"]) == (False, "already_settled")
    options = event_options(refund_id, "evt_reversal_raced")  # as if both had passed the webhook at once
    svc.client.enqueue(options, refund_id, provider_refund_id, {"id": "evt_reversal_raced", "status": "failed"})
    done = wait_for(lambda: finished(svc.client, options["workflow_id"]), timeout=60, what="the raced event's run")
    assert done["status"] == "settled" and recorded("evt_reversal_raced") == ("ignored", "already_settled", refund_id)
    note = ProviderEvent(
        key="evt_direct_reverse_1", source="webhook", event_type="refund.failed", provider_refund_id=provider_refund_id
    )
    assert not reverse_payment_step(refund_id, fetch_refund(provider_refund_id, ""), alert="again", event=note)

    assert refunded_minor("ord_1001") == 0 and row(refund_id).status == "failed"
    assert audit_events(refund_id).count("refund_reversed") == 1 and len(alerts(refund_id)) == 1
    assert len(svc.slack.received("webhook")) == 1
    assert svc.metric(source="webhook", outcome="accepted", reason="reversed") == 1
    assert svc.metric(source="webhook", outcome="ignored", reason="already_settled") == 3
    assert chain_ok()


def test_a_reversed_refund_is_never_retried_into_a_paid_row_and_row_and_provider_agree(svc: Service) -> None:
    """The console does not offer to retry a refund the provider reversed; forced anyway (a fork from its payment
    step, as `dbos workflow fork` could), the provider's replayed "succeeded" is read again before it is booked:
    the row says failed, the order refundable, as the provider has it."""
    refund_id = submit(svc.client, "prov-no-retry-01")
    until(svc.client, refund_id, "completed")
    provider_refund_id = row(refund_id).provider_refund_id
    web.post(
        f"{svc.env.sandbox.base_url}/_sandbox/refunds/{provider_refund_id}/fail",
        json={"failure_reason": "lost_or_stolen_card"},
        headers=SANDBOX,
    ).raise_for_status()
    until(svc.client, refund_id, "failed", timeout=60)
    refused = actions.refusal(svc.client, refund_id, "fork")
    assert refused is not None and provider_refund_id in refused and "submit a new refund" in refused, refused

    steps = svc.client.list_workflow_steps(refund_id)
    [reserve] = [s["function_id"] for s in steps if s["function_name"] == "refunds.record_verdict_and_reserve"]
    version = svc.env.settings().runtime.app_version
    fork = svc.client.fork_workflow(refund_id, reserve, application_version=version, queue_name=REFUND_QUEUE)
    outcome = wait_for(lambda: finished(svc.client, fork.get_workflow_id()), timeout=60, what="the forced retry")
    assert (outcome["status"], outcome.get("provider_status")) == ("failed", "failed"), outcome
    provider = svc.provider_refund(provider_refund_id)
    assert provider["status"] == "failed" and len(svc.env.sandbox.refunds("ch_ord_1001")) == 1
    assert row(refund_id).status == "failed" and refunded_minor("ord_1001") == 0  # as the provider has it
    paid = [e for e in audit_events(refund_id) if e == "refund_paid"]
    assert len(paid) == 1  # the first payment only: the replay was never booked
    assert actions.refusal(svc.client, refund_id, "fork") is not None
    assert chain_ok()
