"""A refund's claim and evidence where people look: `GET /refunds/{id}`, its schema, and the console's page.

The refund runs for real; its row's ``claim_category`` and ``evidence`` columns are then set as the verdict's
recording writes them (``Evidence.model_dump(mode="json")``), with outside text that tries to be markup.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent.claims import evidence_lines
from agent.status import wait_for_outcome
from steps import notify
from steps.evidence import (
    Evidence,
    ReturnLine,
    ReturnReceipt,
    RiskSignals,
    Ticket,
    TicketComment,
    TicketHistory,
    Tracking,
    TrackingEvent,
)
from steps.store import app_db, refunds
from tests import web
from tests.conftest import Env
from tests.console_server import API_TOKEN, ConsoleServer, console_server
from tests.test_workflow import parked

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
AT = datetime(2026, 11, 30, 14, 2, tzinfo=UTC)
SCRIPT = "<script>alert(1)</script>"
PRIVATE = "my account password is hunter2"
EVIDENCE = Evidence(
    tracking=Tracking(
        carrier="UPS",
        tracking_code="1Z999AA10123451012",
        status="delivered",
        delivered_at=AT,
        signed_by="J. DOE",
        events=[
            TrackingEvent(status="in_transit", message="Departed facility", at=datetime(2026, 11, 29, tzinfo=UTC)),
            TrackingEvent(status="delivered", message="Delivered", at=AT, place=f"Austin TX {SCRIPT}"),
        ],
    ),
    returns=ReturnReceipt(
        order_id="ord_1001",
        rma_id="RMA-123",
        status="received",
        currency="USD",
        received_at=AT,
        lines=[ReturnLine(description="Mouse", quantity=1, amount=Decimal("42"), received=True, condition="new")],
    ),
    risk=RiskSignals(charge_id="ch_ord_1001"),
    tickets=TicketHistory(
        email="ada@example.com",
        tickets=[
            Ticket(
                ticket_id="77",
                subject=f"Broken {SCRIPT}",
                status="solved",
                created_at=AT,
                comments=[TicketComment(author_role="end-user", body=PRIVATE, at=AT)],
            )
        ],
    ),
    failed={"tickets": "helpdesk answered 503"},
)


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def _finished_refund(server: ConsoleServer, client: DBOSClient, key: str) -> str:
    """A refund paid and finished, its row as refunds decided before claims were recorded have it."""
    body = {"order_id": "ord_1001", "message": "The mouse stopped working."}
    with web.client(base_url=server.base_url, timeout=30) as http:
        accepted = http.post("/refunds", json=body, headers={**AUTH, "Idempotency-Key": key})
    assert accepted.status_code == 202, accepted.text
    refund_id = str(accepted.json()["refund_id"])
    assert wait_for_outcome(client, refund_id)["status"] == "completed"
    with app_db().engine.begin() as conn:  # as a release before evidence left its row
        conn.execute(
            sa.update(refunds).where(refunds.c.refund_id == refund_id).values(claim_category=None, evidence=sa.null())
        )
    return refund_id


def _record_claim(refund_id: str, category: str, evidence: Evidence) -> None:
    with app_db().engine.begin() as conn:
        conn.execute(
            sa.update(refunds)
            .where(refunds.c.refund_id == refund_id)
            .values(claim_category=category, evidence=evidence.model_dump(mode="json"))
        )


def test_the_api_shows_the_claim_and_its_evidence_without_ticket_comments(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = _finished_refund(server, client, "claim-api-0001")
    with web.client(base_url=server.base_url, timeout=30, headers=AUTH) as http:
        before = http.get(f"/refunds/{refund_id}").json()
        assert before["claim"] == {"category": None, "category_label": None, "evidence": None, "summary": []}
        assert before["status"] == "completed" and before["payment"]["provider_refund_id"]  # the rest unchanged
        _record_claim(refund_id, "not_received", EVIDENCE)
        response = http.get(f"/refunds/{refund_id}")
        schema = http.get("/openapi.json").json()
    claim = response.json()["claim"]
    assert claim["category"] == "not_received" and claim["category_label"] == "not received"
    assert claim["summary"] == evidence_lines(EVIDENCE) and len(claim["summary"]) == 5
    tracking = claim["evidence"]["tracking"]
    assert tracking["status"] == "delivered" and tracking["events"][-1]["place"] == f"Austin TX {SCRIPT}"
    assert claim["evidence"]["returns"]["lines"][0]["amount"] == "42"
    assert claim["evidence"]["risk"] == {"charge_id": "ch_ord_1001", "early_fraud_warnings": [], "disputes": []}
    ticket = {"ticket_id": "77", "subject": f"Broken {SCRIPT}", "status": "solved", "comments": 1}
    assert claim["evidence"]["tickets"] == {"count": 1, "tickets": [{**ticket, "created_at": "2026-11-30T14:02:00Z"}]}
    assert claim["evidence"]["failed"] == {"tickets": "helpdesk answered 503"}
    assert PRIVATE not in response.text and "ada@example.com" not in response.text
    documented = schema["paths"]["/refunds/{refund_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert documented["schema"] == {"$ref": "#/components/schemas/RefundView"}
    view = schema["components"]["schemas"]
    assert view["RefundView"]["properties"]["claim"] == {"$ref": "#/components/schemas/ClaimView"}
    assert set(view["ClaimView"]["properties"]) == {"category", "category_label", "evidence", "summary"}
    assert (
        "comments" not in view["TicketsView"]["properties"]
        and view["TicketView"]["properties"]["comments"]["type"] == "integer"
    )


def test_the_console_shows_the_claim_escaped_and_nothing_for_a_refund_without_one(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = _finished_refund(server, client, "claim-console-0001")
    page = f"/console/refunds/{refund_id}"
    with server.signed_in("vic") as vic:
        assert "Claim and evidence" not in vic.get(page).text  # a refund from before evidence
        _record_claim(refund_id, "not_received", EVIDENCE)
        html = vic.get(page).text
    assert "Claim and evidence" in html and '<dd id="claim-category">not received</dd>' in html
    assert "Tracking (UPS 1Z999AA10123451012): delivered 2026-11-30 14:02 UTC, signed by J. DOE" in html
    assert "Earlier tickets could not be read: helpdesk answered 503" in html
    assert '<table id="tracking-events">' in html and "2026-11-30 14:02:00 UTC" in html and "Departed facility" in html
    assert SCRIPT not in html and "Austin TX &lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Broken &lt;script&gt;" in html and PRIVATE not in html


def test_a_claim_the_agent_investigated_shows_what_the_carrier_said(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    body = {"order_id": "ord_1002", "message": "My parcel never arrived."}
    with web.client(base_url=server.base_url, timeout=30, headers=AUTH) as http:
        accepted = http.post("/refunds", json=body, headers={"Idempotency-Key": "claim-e2e-0001"})
        assert accepted.status_code == 202, accepted.text
        parked(client, "claim-e2e-0001")
        claim = http.get("/refunds/claim-e2e-0001").json()["claim"]
    assert claim["category"] == "not_received" and claim["evidence"]["tracking"]["signed_by"] == "G HOPPER"
    [line] = claim["summary"]
    assert line.startswith("Tracking (UPS 1Z000000000000001002): delivered ") and "signed by G HOPPER" in line
    with app_db().engine.connect() as conn:
        sent = [m["body"] for m in notify.messages(conn, "claim-e2e-0001") if m["channel"] == "approvers"]
    assert sent and all(f"\nClaim: not received\nEvidence:\n- {line}\nDecide: " in body for body in sent)
    with server.signed_in("vic") as vic:
        html = vic.get("/console/refunds/claim-e2e-0001").text
    assert "Claim and evidence" in html and "signed by G HOPPER; last event: Delivered" in html


def test_a_refund_parked_on_an_early_fraud_warning_is_flagged_on_its_page(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    body = {"order_id": "ord_1016", "message": "I was charged twice for this watch band."}
    with web.client(base_url=server.base_url, timeout=30, headers=AUTH) as http:
        accepted = http.post("/refunds", json=body, headers={"Idempotency-Key": "claim-efw-00001"})
        assert accepted.status_code == 202, accepted.text
    assert "reported the charge as fraud" in parked(client, "claim-efw-00001")["reason"]  # a person decides
    with server.signed_in("vic") as vic:
        html = vic.get("/console/refunds/claim-efw-00001").text
    assert "<dt>Flagged</dt>" in html and "early fraud warning: follow up" in html
    assert "<dt>Evidence showed</dt>" in html and "the card issuer reported the charge as fraud" in html
