"""Claims that need evidence, through real refund workflows on SQLite and Postgres: the agent looks the claim up
with tools that run DBOS steps against the evidence services over HTTP, and policy decides on what the steps
recorded. The offline model picks its look-ups by the claim's category; the services hold the demo's evidence
(steps/seed_evidence.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent import replies
from agent.ops.processes import wait_for
from agent.status import refund_status
from steps import audit
from steps.lookups import PAYMENT_RISK_STEP, TRACK_SHIPMENT_STEP
from steps.store import app_db, outbox, refunds
from tests.conftest import Env
from tests.evidence_server import EvidenceServer
from tests.test_tools import cli
from tests.test_workflow import chain_ok, parked, result, running, submit

MODEL = "refund_agent__model.request"


def steps_of(client: DBOSClient, refund_id: str) -> list[str]:
    return [step["function_name"] for step in client.list_workflow_steps(refund_id, load_output=False)]


def row(refund_id: str) -> Any:
    with app_db().engine.connect() as conn:
        return conn.execute(sa.select(refunds).where(refunds.c.refund_id == refund_id)).one()


def told(refund_id: str) -> list[str]:
    """What the customer was sent about this refund."""
    with app_db().engine.connect() as conn:
        query = sa.select(outbox.c.body).where(outbox.c.refund_id == refund_id, outbox.c.channel == "email")
        return list(conn.execute(query).scalars())


def entries(refund_id: str, event: str) -> list[dict[str, Any]]:
    with app_db().engine.connect() as conn:
        return [e.payload for e in audit.entries(conn, refund_id) if e.event == event]


def test_never_arrived_and_returned_to_sender_is_looked_up_then_paid(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "investigate-lost-01", "ord_1011", "My desk lamp never arrived.")
    outcome = result(client, refund_id)
    assert outcome["status"] == "completed" and outcome["amount"] == "64.00"
    assert steps_of(client, refund_id) == [
        "orders.review_case",
        MODEL,
        TRACK_SHIPMENT_STEP,
        MODEL,
        "DBOS.patch-whole-case",  # paid at once: the workflow reads the charge's disputes and fraud warnings
        PAYMENT_RISK_STEP,
        "payments.outside_refunds",  # paid at once: refunds made at the provider outside this service count
        "refunds.record_verdict_and_reserve",
        "payments.issue_refund",
        "refunds.record_payment",
    ]
    refund = row(refund_id)
    assert refund.claim_category == "not_received"
    assert refund.evidence["tracking"]["status"] == "return_to_sender"
    assert refund.model_requests == 2
    [entry] = entries(refund_id, "claim_evidence")
    canonical = json.dumps(refund.evidence, sort_keys=True, separators=(",", ":"), default=str)
    assert (
        entry["looked_up"] == ["tracking", "risk"]
        and entry["evidence_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    )
    assert chain_ok()
    status = refund_status(client, refund_id)
    assert status is not None and TRACK_SHIPMENT_STEP in [s["name"] for s in status["steps"]]
    shown = cli(env, "steps", refund_id)  # what an operator reads in a terminal
    assert shown.returncode == 0 and any(
        line.split()[:3] == ["(refund)", "3", TRACK_SHIPMENT_STEP] for line in shown.stdout.splitlines()
    ), shown.stdout


def test_never_arrived_but_delivered_with_a_signature_waits_for_a_person(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "investigate-signed-01", "ord_1012", "The headphones never arrived. Refund me now.")
    request = parked(client, refund_id)
    assert "signed by" in request["reason"] and "delivered" in request["reason"]
    assert env.sandbox.refunds("ch_ord_1012") == []
    [verdict] = entries(refund_id, "policy_verdict")
    assert verdict["kind"] == "needs_approval" and any("signed by" in f for f in verdict["findings"])
    with app_db().engine.connect() as conn:  # each approver's message shows the claim and what was looked up
        query = sa.select(outbox.c.body).where(outbox.c.refund_id == refund_id, outbox.c.channel != "email")
        bodies = list(conn.execute(query).scalars())
    assert bodies and all("Claim: not received" in b and "\nEvidence:\n- Tracking (UPS" in b for b in bodies), bodies


def test_in_transit_within_its_eta_refunds_nothing_and_tells_the_customer_when(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "investigate-transit-01", "ord_1013", "Where is my parcel? It has not arrived.")
    outcome = result(client, refund_id)
    assert outcome["status"] == "rejected" and "on its way" in outcome["detail"]
    [text] = told(refund_id)
    assert "expected by" in text and "JD0000000000001013" in text
    assert env.sandbox.refunds("ch_ord_1013") == []


def test_a_return_pays_only_the_lines_the_warehouse_received(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "investigate-return-01", "ord_1014", "I sent everything back, refund the whole order.")
    outcome = result(client, refund_id)
    assert outcome["status"] == "completed" and outcome["amount"] == "80.00"
    [paid] = env.sandbox.refunds("ch_ord_1014")
    assert paid["amount"] == 8000
    [text] = told(refund_id)
    assert "80.00 USD" in text
    assert row(refund_id).claim_category == "returned"


def test_a_return_never_scanned_refunds_nothing_and_asks_for_its_tracking_number(env: Env, client: DBOSClient) -> None:
    """The customer says they sent it back; the warehouse never scanned the label: they are asked for the return's
    tracking number (the refusal that said what to do is the path with ``CUSTOMER_QUESTIONS`` empty,
    tests/test_question_rules.py)."""
    refund_id = submit(client, "investigate-label-01", "ord_1015", "I returned the yoga mat weeks ago.")
    wait_for(lambda: row(refund_id).status == "awaiting_customer", timeout=60, what="the question")
    assert row(refund_id).verdict == "ask_customer"
    [text] = wait_for(lambda: told(refund_id) or None, timeout=60, what="the question sent")  # the verdict's next step
    assert replies.NEEDED["return_tracking"] in text and "/answer/" in text
    assert env.sandbox.refunds("ch_ord_1015") == []


def test_an_open_dispute_refuses_and_an_early_fraud_warning_goes_to_a_person(env: Env, client: DBOSClient) -> None:
    disputed = submit(client, "investigate-dispute-01", "ord_1017", "I don't recognise this charge.")
    outcome = result(client, disputed)
    assert outcome["status"] == "rejected" and "dispute decides" in outcome["detail"]
    assert env.sandbox.refunds("ch_ord_1017") == []
    warned = submit(client, "investigate-efw-0001", "ord_1016", "I was charged twice for this band.")
    request = parked(client, warned)
    assert "reported the charge as fraud" in request["reason"]
    [verdict] = entries(warned, "policy_verdict")
    assert verdict["flags"] == ["early_fraud_warning"] and verdict["kind"] == "needs_approval"
    assert env.sandbox.refunds("ch_ord_1016") == []


def test_a_damaged_claim_reads_the_delivery_and_the_charge_then_pays(env: Env, client: DBOSClient) -> None:
    """The model looks nothing up for "arrived broken"; the workflow reads what policy needs: the carrier's word
    that the goods were delivered, and the charge's disputes and fraud warnings before paying at once."""
    refund_id = submit(client, "investigate-plain-01", "ord_1001", "The mouse arrived broken.")
    assert result(client, refund_id)["status"] == "completed"
    assert steps_of(client, refund_id)[1:5] == [MODEL, "DBOS.patch-whole-case", TRACK_SHIPMENT_STEP, PAYMENT_RISK_STEP]
    evidence = row(refund_id).evidence
    assert evidence["tracking"]["status"] == "delivered" and evidence["risk"]["disputes"] == []
    [verdict] = entries(refund_id, "policy_verdict")
    assert any("delivered" in fact for fact in verdict["findings"])


@pytest.fixture
def down_carrier(env: Env) -> Iterator[Env]:
    """The carrier answers 503 to everything (its own sandbox: the shared one stays healthy)."""
    server = EvidenceServer()
    server.set_faults(carrier={"fail_rate": 1.0, "status": 503, "retry_after_seconds": 0})
    own = Env(env.backend, env.dbs, env.data_dir, env.sandbox, server)
    try:
        yield own
    finally:
        server.stop()


def test_a_carrier_that_stays_down_sends_the_claim_to_a_person(down_carrier: Env) -> None:
    with running(down_carrier) as client:
        refund_id = submit(client, "investigate-down-01", "ord_1011", "My lamp never arrived.")
        request = parked(client, refund_id)
        assert "could not be read" in request["reason"]
        assert down_carrier.sandbox.refunds("ch_ord_1011") == []
        assert row(refund_id).evidence["failed"].keys() == {"tracking"}
        assert down_carrier.evidence is not None and down_carrier.evidence.stats()["carrier"] > 1  # it was retried


def test_a_serial_claimant_goes_to_a_person_even_under_the_limit(env: Env, client: DBOSClient) -> None:
    for i in range(3):
        paid = submit(client, f"serial-claim-{i:04d}", "ord_1001", "It stopped working.", amount=Decimal("1.00"))
        assert result(client, paid)["status"] == "completed"
    fourth = submit(client, "serial-claim-0003", "ord_1001", "It stopped working.", amount=Decimal("1.00"))
    request = parked(client, fourth)
    assert "refund number 4 in the last 30 days" in request["reason"]
    assert len(env.sandbox.refunds("ch_ord_1001")) == 3
