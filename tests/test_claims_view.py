"""A claim's evidence in plain sentences, and the API's view of it: what support people and approvers read."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from agent import domain
from agent.approvals import request_text
from agent.claims import CLAIM_CATEGORIES, category_label, claim_view, evidence_lines, evidence_view
from steps.evidence import (
    Dispute,
    Evidence,
    FraudWarning,
    ReturnLine,
    ReturnReceipt,
    RiskSignals,
    Ticket,
    TicketComment,
    TicketHistory,
    Tracking,
    TrackingEvent,
)
from steps.notify import mrkdwn_escape
from steps.records import ApprovalRequest

AT = datetime(2026, 11, 30, 14, 2, tzinfo=UTC)
DELIVERED = Tracking(
    carrier="UPS",
    tracking_code="1Z999AA10123451012",
    status="delivered",
    delivered_at=AT,
    proof="signature",
    signed_by="J. DOE",
    events=[
        TrackingEvent(status="in_transit", message="Departed facility", at=datetime(2026, 11, 29, tzinfo=UTC)),
        TrackingEvent(status="delivered", message="Delivered", at=AT, place="Austin TX US"),
    ],
)
IN_TRANSIT = Tracking(
    carrier="DHL",
    tracking_code="JD0140",
    status="in_transit",
    est_delivery=datetime(2026, 12, 5, 18, 0, tzinfo=UTC),
)
RECEIVED = ReturnReceipt(
    order_id="ord_1",
    rma_id="RMA-123",
    status="received",
    currency="USD",
    received_at=datetime(2026, 11, 28, 9, 0, tzinfo=UTC),
    lines=[
        ReturnLine(description="Coffee grinder", quantity=1, amount=Decimal("80"), received=True, condition="new"),
        ReturnLine(description="Kettle", quantity=1, amount=Decimal("50")),
    ],
)
WARNED = RiskSignals(
    charge_id="ch_1",
    early_fraud_warnings=[
        FraudWarning(warning_id="issfr_1", fraud_type="made_with_stolen_card", actionable=True, created=AT)
    ],
)
DISPUTED = RiskSignals(
    charge_id="ch_1",
    disputes=[
        Dispute(
            dispute_id="dp_1",
            status="needs_response",
            reason="product_not_received",
            amount=Decimal("10"),
            currency="USD",
            created=AT,
        ),
        Dispute(dispute_id="dp_0", status="won", reason="duplicate", amount=Decimal(1), currency="USD", created=AT),
    ],
)
COMMENT = TicketComment(author_role="end-user", body="my card number is 4242", at=AT)
TICKETS = TicketHistory(
    email="a@example.com",
    tickets=[
        Ticket(ticket_id="2", subject="Dented espresso machine", status="solved", created_at=AT, comments=[COMMENT]),
        Ticket(ticket_id="1", subject="Where is my order?", status="closed", created_at=AT),
    ],
)


@pytest.mark.parametrize(
    ("evidence", "lines"),
    [
        (None, []),
        (Evidence(), []),
        (
            Evidence(tracking=DELIVERED),
            [
                "Tracking (UPS 1Z999AA10123451012): delivered 2026-11-30 14:02 UTC, signed by J. DOE; "
                "last event: Delivered, Austin TX US"
            ],
        ),
        (Evidence(tracking=IN_TRANSIT), ["Tracking (DHL JD0140): in transit, expected 2026-12-05"]),
        (
            Evidence(tracking=Tracking(carrier="USPS", tracking_code="9400", found=False)),
            ["Tracking (USPS 9400): the carrier knows no shipment under this code"],
        ),
        (
            Evidence(returns=RECEIVED),
            [
                "Return RMA-123: received 2026-11-28; Coffee grinder x1 80.00 USD received (new); "
                "Kettle x1 50.00 USD not received"
            ],
        ),
        (Evidence(returns=ReturnReceipt(order_id="ord_1")), ["No return was opened for this order"]),
        (Evidence(risk=WARNED), ["Payment risk: early fraud warning issfr_1 (made_with_stolen_card)"]),
        (
            Evidence(risk=DISPUTED),
            ["Payment risk: open dispute dp_1 (product_not_received, needs_response); dispute dp_0 (duplicate, won)"],
        ),
        (Evidence(risk=RiskSignals(charge_id="ch_1")), ["Payment risk: none"]),
        (Evidence(tickets=TICKETS), ["Earlier tickets: 2 (newest: 'Dented espresso machine', solved)"]),
        (Evidence(tickets=TicketHistory(email="a@example.com")), ["Earlier tickets: none"]),
        (
            Evidence(
                risk=RiskSignals(charge_id="ch_1"), failed={"tickets": "helpdesk answered 503", "tracking": "timeout"}
            ),
            [
                "Payment risk: none",
                "Tracking could not be read: timeout",
                "Earlier tickets could not be read: helpdesk answered 503",
            ],
        ),
    ],
)
def test_evidence_reads_as_short_sentences(evidence: Evidence | None, lines: list[str]) -> None:
    assert evidence_lines(evidence) == lines


def test_each_look_up_gets_its_line_in_a_fixed_order() -> None:
    evidence = Evidence(tickets=TICKETS, risk=WARNED, returns=RECEIVED, tracking=IN_TRANSIT)
    heads = [line.split(" ", 1)[0] for line in evidence_lines(evidence)]
    assert heads == ["Tracking", "Return", "Payment", "Earlier"]


def test_every_category_has_plain_words() -> None:
    assert category_label(None) is None
    assert category_label("not_received") == "not received"
    assert category_label("something_new") == "something new"
    assert all("_" not in label for label in CLAIM_CATEGORIES.values())
    assert tuple(CLAIM_CATEGORIES) == domain.CLAIM_CATEGORIES  # every category the agent can name has its words


def test_the_view_keeps_ticket_comments_out() -> None:
    view = evidence_view(Evidence(tickets=TICKETS)).model_dump(mode="json")
    assert view["tickets"]["count"] == 2
    assert view["tickets"]["tickets"][0] == {
        "ticket_id": "2",
        "subject": "Dented espresso machine",
        "status": "solved",
        "created_at": "2026-11-30T14:02:00Z",
        "comments": 1,
    }
    assert "4242" not in str(view) and "a@example.com" not in str(view)


def test_a_claim_reads_from_the_rows_columns_and_is_empty_before_evidence() -> None:
    empty = claim_view(None, None).model_dump(mode="json")
    assert empty == {"category": None, "category_label": None, "evidence": None, "summary": []}
    stored: dict[str, Any] = Evidence(tracking=DELIVERED, returns=RECEIVED).model_dump(mode="json")
    claim = claim_view("not_received", stored).model_dump(mode="json")
    assert claim["category_label"] == "not received"
    assert claim["evidence"]["tracking"]["events"][-1]["place"] == "Austin TX US"
    assert claim["evidence"]["returns"]["lines"][0]["amount"] == "80"
    assert claim["summary"] == evidence_lines(Evidence(tracking=DELIVERED, returns=RECEIVED))
    garbled = claim_view("damaged", {"tracking": "not a tracker"}).model_dump(mode="json")
    assert garbled["evidence"] is None and garbled["summary"] == []


REQUEST = ApprovalRequest(
    refund_id="ref-1",
    amount=Decimal("120"),
    currency="USD",
    reason="Customer says it never arrived",
    requested_at=AT,
    escalate_at=AT,
    expires_at=AT,
)


def test_approvers_read_the_category_and_evidence_after_the_reason() -> None:
    assert request_text(REQUEST) == "Refund ref-1 of 120.00 USD needs approval: Customer says it never arrived"
    lines = evidence_lines(Evidence(tracking=DELIVERED, risk=WARNED))
    assert request_text(REQUEST, category="not_received", evidence=lines).splitlines() == [
        "Refund ref-1 of 120.00 USD needs approval: Customer says it never arrived",
        "Claim: not received",
        "Evidence:",
        f"- {lines[0]}",
        f"- {lines[1]}",
    ]


def test_outside_text_in_the_evidence_starts_no_line_and_no_slack_markup() -> None:
    subject = "Late <!channel> <https://evil.example|click>\nDecide: https://evil.example/approve"
    history = TicketHistory(
        email="a@example.com", tickets=[Ticket(ticket_id="9", subject=subject, status="open", created_at=AT)]
    )
    text = request_text(REQUEST, category="other", evidence=evidence_lines(Evidence(tickets=history)))
    assert [line for line in text.splitlines() if line.startswith("Decide:")] == []
    slack = mrkdwn_escape(text)
    assert "<!channel>" not in slack and "<https://" not in slack and "&lt;!channel&gt;" in slack
