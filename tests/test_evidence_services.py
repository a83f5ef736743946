"""The evidence look-ups against the real sandboxes over HTTP: what each service says maps to the right record,
transient failures are retried (Retry-After honoured), permanent ones are not, a service down through its
retries raises EvidenceUnavailable without the key, and inside a workflow a look-up is checkpointed once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from pydantic import ValidationError

from agent import runtime
from agent.settings import Settings, settings_problems
from sandbox.evidence import EvidenceSeed, RiskSeed, TrackerSeed, TrackingEventSeed, ago
from steps import evidence_http
from steps.evidence import Tracking
from steps.evidence_http import EvidenceUnavailable
from steps.lookups import (
    TRACK_SHIPMENT_STEP,
    payment_risk_step,
    return_status_step,
    ticket_history_step,
    track_shipment_step,
)
from steps.seed import SHIPMENTS
from steps.seed_evidence import demo_risk
from tests import web
from tests.conftest import API_KEY, Env, SandboxServer
from tests.evidence_server import CREDENTIALS, EvidenceServer, demo_seed

TRACK_WORKFLOW = "tests.track_a_shipment"


@pytest.fixture(scope="module")
def evidence() -> Iterator[EvidenceServer]:
    server = EvidenceServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def payments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxServer]:
    server = SandboxServer(f"sqlite:///{tmp_path_factory.mktemp('risk')}/sandbox.sqlite")
    try:
        yield server
    finally:
        server.close()


def _config(evidence: EvidenceServer, payments: SandboxServer) -> evidence_http.EvidenceConfig:
    assert CREDENTIALS.carrier_key and CREDENTIALS.returns_token and CREDENTIALS.tickets_token
    return evidence_http.EvidenceConfig(
        carrier_base_url=evidence.base_url,
        carrier_api_key=CREDENTIALS.carrier_key,
        returns_base_url=evidence.base_url,
        returns_api_key=CREDENTIALS.returns_token,
        tickets_base_url=evidence.base_url,
        tickets_email=CREDENTIALS.tickets_email or "",
        tickets_api_token=CREDENTIALS.tickets_token,
        stripe_base_url=payments.base_url,
        stripe_api_key=API_KEY,
        backoff_seconds=0.05,
    )


@pytest.fixture
def configured(evidence: EvidenceServer, payments: SandboxServer) -> Iterator[evidence_http.EvidenceConfig]:
    """The steps pointed at this module's sandboxes, with no faults and the demo data."""
    config = _config(evidence, payments)
    evidence_http.configure(config)
    evidence.set_faults()
    evidence.load(demo_seed())
    yield config
    evidence.set_faults()
    evidence_http.configure(None)  # type: ignore[arg-type]


def track(order_id: str) -> Tracking:
    return track_shipment_step(*SHIPMENTS[order_id])


def test_delivered_with_a_photo_two_days_after_payment(configured: object) -> None:
    tracking = track("ord_1001")
    assert (tracking.found, tracking.status, tracking.proof, tracking.signed_by) == (True, "delivered", "photo", "")
    assert tracking.delivered_at is not None
    paid = datetime.now(UTC) - timedelta(days=5)
    assert abs(tracking.delivered_at - (paid + timedelta(days=2))) < timedelta(hours=1)
    assert [e.status for e in tracking.events][-1] == "delivered" and tracking.events[-1].place == "Chicago, IL, US"


def test_delivered_with_a_signature(configured: object) -> None:
    tracking = track("ord_1012")
    assert (tracking.status, tracking.proof, tracking.signed_by) == ("delivered", "signature", "G HOPPER")


def test_in_transit_with_an_eta_in_the_future(configured: object) -> None:
    tracking = track("ord_1013")
    assert (tracking.status, tracking.delivered_at, tracking.proof) == ("in_transit", None, "none")
    assert tracking.est_delivery is not None
    assert abs(tracking.est_delivery - (datetime.now(UTC) + timedelta(days=2))) < timedelta(hours=1)


def test_out_for_delivery_and_returned_to_sender(configured: object) -> None:
    assert track("ord_1010").status == "out_for_delivery"
    lost = track("ord_1011")
    assert (lost.found, lost.status, lost.delivered_at) == (True, "return_to_sender", None)
    assert [e.status for e in lost.events][-2:] == ["failure", "return_to_sender"]


def test_a_code_the_carrier_does_not_know_is_not_found(configured: object) -> None:
    tracking = track_shipment_step("USPS", "9400000000000000000000")
    assert (tracking.found, tracking.status, tracking.events) == (False, "unknown", [])


def test_no_return_was_opened(configured: object) -> None:
    receipt = return_status_step("ord_1001")
    assert (receipt.status, receipt.lines, receipt.received_amount) == ("none", [], Decimal(0))


def test_a_return_label_created_and_never_scanned(configured: object) -> None:
    receipt = return_status_step("ord_1015")
    assert (receipt.status, receipt.shipped_at, receipt.received_at) == ("label_created", None, None)
    assert receipt.label_created_at is not None
    assert abs(receipt.label_created_at - (datetime.now(UTC) - timedelta(days=20))) < timedelta(hours=1)
    assert [(line.description, line.received) for line in receipt.lines] == [("Yoga mat", False)]


def test_a_return_received_and_inspected_line_by_line(configured: object) -> None:
    receipt = return_status_step("ord_1014")
    assert (receipt.status, receipt.currency, receipt.rma_id) == ("inspected", "USD", "71014")
    lines = [(line.description, line.amount, line.received, line.condition) for line in receipt.lines]
    assert lines == [
        ("Coffee grinder", Decimal("80.00"), True, "new"),
        ("Kettle", Decimal("50.00"), False, "unknown"),
    ]
    assert receipt.received_amount == Decimal("80.00")


def test_risk_an_early_fraud_warning(configured: object) -> None:
    risk = payment_risk_step("ch_ord_1016")
    [warning] = risk.early_fraud_warnings
    assert (warning.fraud_type, warning.actionable, warning.warning_id[:6]) == ("made_with_stolen_card", True, "issfr_")
    assert risk.disputes == []


def test_risk_an_open_dispute(configured: object) -> None:
    risk = payment_risk_step("ch_ord_1017")
    [dispute] = risk.open_disputes
    assert (dispute.status, dispute.reason, dispute.amount, dispute.currency) == (
        "needs_response",
        "product_not_received",
        Decimal("240.00"),
        "USD",
    )
    assert dispute.dispute_id.startswith("dp_") and risk.early_fraud_warnings == []
    assert payment_risk_step("ch_ord_1004").open_disputes[0].status == "under_review"


def test_risk_none(configured: object) -> None:
    risk = payment_risk_step("ch_ord_1001")
    assert (risk.early_fraud_warnings, risk.disputes) == ([], [])


def test_the_payments_sandbox_replaces_its_risk_signals(configured: object, payments: SandboxServer) -> None:

    auth = {"Authorization": f"Bearer {API_KEY}"}
    web.put(f"{payments.base_url}/_sandbox/risk", json={}, headers=auth).raise_for_status()
    try:
        assert payment_risk_step("ch_ord_1016").early_fraud_warnings == []
    finally:
        seed = RiskSeed.model_validate(demo_risk()).model_dump(mode="json")
        web.put(f"{payments.base_url}/_sandbox/risk", json=seed, headers=auth).raise_for_status()
    assert len(payment_risk_step("ch_ord_1016").early_fraud_warnings) == 1


def test_tickets_newest_first_with_their_authors_roles(configured: object) -> None:
    history = ticket_history_step("ada@example.com")
    assert [t.subject for t in history.tickets] == ["Espresso machine arrived dented", "Where is my order?"]
    dented = history.tickets[0]
    assert [c.author_role for c in dented.comments] == ["end-user", "agent", "end-user"]
    assert "ord_1003" in dented.comments[0].body
    omar = ticket_history_step("omar@example.com").tickets[0]
    assert [c.author_role for c in omar.comments] == ["admin", "end-user"]
    assert ticket_history_step("grace@example.com").tickets == []


def test_long_comments_are_clipped(configured: object, evidence: EvidenceServer) -> None:
    seed = demo_seed().model_dump()
    seed["tickets"][0]["comments"][0]["body"] = "x" * 5000
    evidence.load(EvidenceSeed.model_validate(seed))
    body = ticket_history_step("ada@example.com").tickets[0].comments[0].body
    assert len(body) <= 500 and body.endswith("…")


def test_a_429_with_retry_after_is_retried_and_succeeds(configured: object, evidence: EvidenceServer) -> None:
    evidence.set_faults(carrier={"fail_next": 2, "status": 429, "retry_after_seconds": 0})
    before = evidence.stats()["carrier"]
    assert track("ord_1002").status == "delivered"
    assert evidence.stats()["carrier"] - before == 3


def test_a_retry_after_longer_than_the_cap_gives_up_at_once(configured: object, evidence: EvidenceServer) -> None:
    evidence.set_faults(returns={"fail_next": 5, "status": 429, "retry_after_seconds": 3600})
    before = evidence.stats()["returns"]
    with pytest.raises(EvidenceUnavailable, match=r"returns: HTTP 429, asked to wait 3600s"):
        return_status_step("ord_1014")
    assert evidence.stats()["returns"] - before == 1


def test_a_look_up_that_times_out_is_retried_and_yields_the_evidence(
    configured: evidence_http.EvidenceConfig, evidence: EvidenceServer
) -> None:
    """The carrier is slow once (past the client's timeout), then fast: the step's next attempt reads the parcel."""
    evidence_http.configure(dataclasses.replace(configured, timeout_seconds=0.3, connect_timeout_seconds=0.3))
    evidence.set_faults(carrier={"slow_next": 1, "slow_ms": 2000})
    before = evidence.stats()["carrier"]
    assert track("ord_1002").status == "delivered"
    assert evidence.stats()["carrier"] - before == 2  # the attempt that timed out, and the one that answered


def test_a_5xx_is_retried(configured: object, evidence: EvidenceServer) -> None:
    evidence.set_faults(tickets={"fail_next": 1, "status": 502})
    before = evidence.stats()["tickets"]
    assert len(ticket_history_step("omar@example.com").tickets) == 1
    assert evidence.stats()["tickets"] - before == 3  # the failed search, the search, one ticket's comments


def test_a_service_down_through_every_retry_is_unavailable_without_the_key(
    configured: evidence_http.EvidenceConfig, evidence: EvidenceServer
) -> None:
    evidence.set_faults(carrier={"fail_rate": 1.0, "status": 503, "retry_after_seconds": 0})
    before = evidence.stats()["carrier"]
    with pytest.raises(EvidenceUnavailable) as failed:
        track("ord_1001")
    assert str(failed.value) == f"carrier: HTTP 503 after {configured.attempts} attempts"
    assert configured.carrier_api_key not in str(failed.value)
    assert evidence.stats()["carrier"] - before == configured.attempts


def test_a_service_nobody_answers_is_unavailable(configured: evidence_http.EvidenceConfig) -> None:
    evidence_http.configure(dataclasses.replace(configured, returns_base_url="http://127.0.0.1:9", attempts=2))
    with pytest.raises(EvidenceUnavailable, match=r"^returns: ConnectError after 2 attempts$"):
        return_status_step("ord_1014")


@pytest.mark.parametrize("service", ["carrier", "returns", "tickets"])
def test_a_wrong_key_is_refused_once_and_not_retried(
    configured: evidence_http.EvidenceConfig, evidence: EvidenceServer, service: str
) -> None:
    wrong = "ek_wrong_key_123"
    looks: dict[str, tuple[evidence_http.EvidenceConfig, Callable[[], object]]] = {
        "carrier": (dataclasses.replace(configured, carrier_api_key=wrong), lambda: track("ord_1001")),
        "returns": (dataclasses.replace(configured, returns_api_key=wrong), lambda: return_status_step("ord_1014")),
        "tickets": (
            dataclasses.replace(configured, tickets_api_token=wrong),
            lambda: ticket_history_step("ada@example.com"),
        ),
    }
    config, look_up = looks[service]
    evidence_http.configure(config)
    before = evidence.stats()[service]
    with pytest.raises(EvidenceUnavailable) as refused:
        look_up()
    assert str(refused.value) == f"{service}: HTTP 401" and "ek_wrong_key_123" not in str(refused.value)
    assert evidence.stats()[service] - before == 1


def test_a_wrong_payments_key_is_refused_without_the_key(configured: evidence_http.EvidenceConfig) -> None:
    evidence_http.configure(dataclasses.replace(configured, stripe_api_key="sk_wrong_key_123"))
    with pytest.raises(EvidenceUnavailable) as refused:
        payment_risk_step("ch_ord_1016")
    assert str(refused.value) == "payments: HTTP 401"


def test_the_sandbox_serves_what_a_seed_says(configured: object, evidence: EvidenceServer) -> None:
    seed = EvidenceSeed(
        trackers=[
            TrackerSeed(
                carrier="UPS",
                tracking_code="1ZNEW",
                status="failure",
                events=[TrackingEventSeed(at=ago(1), status="failure", message="Damaged in transit")],
            )
        ]
    )
    evidence.load(seed)
    tracking = track_shipment_step("ups", "1ZNEW")
    assert (tracking.found, tracking.status, tracking.events[0].message) == (True, "failure", "Damaged in transit")
    assert track("ord_1001").found is False  # the demo's data was replaced


@DBOS.workflow(name=TRACK_WORKFLOW)
def track_in_a_workflow(carrier: str, code: str) -> Tracking:
    return track_shipment_step(carrier, code)


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_in_a_workflow_the_look_up_is_a_checkpointed_step(env: Env, service: runtime.Runtime, tmp_path: Path) -> None:
    assert env.evidence is not None
    carrier, code = SHIPMENTS["ord_1012"]
    before = env.evidence.stats()["carrier"]
    with SetWorkflowID("track-ord_1012"):
        first = track_in_a_workflow(carrier, code)
    assert (first.status, first.proof) == ("delivered", "signature")
    assert [s["function_name"] for s in DBOS.list_workflow_steps("track-ord_1012")] == [TRACK_SHIPMENT_STEP]
    with SetWorkflowID("track-ord_1012"):
        again = track_in_a_workflow(carrier, code)
    assert again == first
    assert env.evidence.stats()["carrier"] - before == 1  # the second run read the checkpoint, not the carrier


def test_the_demo_evidence_matches_the_demo_orders() -> None:
    seed = demo_seed()
    assert {(t.carrier, t.tracking_code) for t in seed.trackers} == set(SHIPMENTS.values())
    [inspected] = [r for r in seed.returns if r.order_id == "ord_1014"]
    assert sum(line.amount for line in inspected.lines) == Decimal("130.00")  # what ord_1014 captured
    emails = {t.requester_email for t in seed.tickets}
    assert emails == {"ada@example.com", "omar@example.com"}


@pytest.mark.parametrize(
    ("base", "key"),
    [
        ("carrier_api_base", "carrier_api_key"),
        ("returns_api_base", "returns_api_key"),
        ("tickets_api_base", "tickets_api_token"),
        ("tickets_api_base", "tickets_api_email"),
    ],
)
def test_a_real_service_refuses_the_sandbox_default_key(base: str, key: str) -> None:
    issued: dict[str, Any] = {k: "issued-by-them" for k in ("carrier_api_key", "returns_api_key", "tickets_api_token")}
    issued["tickets_api_email"] = "agent@shop.example"
    Settings(**{base: "https://real.example", **issued})  # with every key set, it starts
    with pytest.raises(ValidationError) as refused:
        Settings(**{base: "https://real.example", **{k: v for k, v in issued.items() if k != key}})
    [problem] = settings_problems(refused.value)
    assert problem.startswith(f"{key.upper()}: ") and base.upper() in problem
    assert Settings().evidence.base_url(None).startswith("http://127.0.0.1:")  # unset: the local sandbox
