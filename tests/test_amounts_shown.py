"""A refund shows the amount asked and the amount paid apart, each by name: GET /refunds/{id}, GET /refunds,
`refund-agent status` (its lines and --json) and the console's list and page; an approval of less pays less."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from dbos import DBOSClient

from agent.console.data import RefundFilter, list_refunds, refund_detail
from agent.status import refund_status, wait_for_outcome
from agent.status_text import summary_lines
from steps import audit
from steps.store import app_db
from tests import web
from tests.conftest import Env
from tests.console_server import ConsoleServer, console_server
from tests.identities import add_approver_client
from tests.test_tools import cli
from tests.test_workflow import parked, result, submit

APPROVER_KEY = "test-key-of-the-approvals-desk-amounts"


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        add_approver_client(app_db().engine, APPROVER_KEY)
        yield running


def status_fields(text: str) -> dict[str, str]:
    """The named rows of `refund-agent status` (``asked``, ``paid``, ...) before its timeline."""
    lines = text.splitlines()
    head = lines[1 : lines.index("Timeline (UTC):")]
    return {line.split()[0]: " ".join(line.split()[1:]) for line in head}


def summary_of(client: DBOSClient, refund_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The refund as the API reads it, and the rows `refund-agent status` prints from it."""
    status = refund_status(client, refund_id)
    assert status is not None
    with app_db().engine.connect() as conn:
        events = audit.entries(conn, refund_id)
    return status, status_fields("\n".join(summary_lines(status, events)))


def listed(order_id: str) -> dict[str, Any]:
    [row], _ = list_refunds(RefundFilter(order=order_id))
    return row


def console_row(html: str, refund_id: str) -> str:
    """The console list's table row of one refund."""
    found = re.search(rf"<tr>\s*<td><a href=\"/console/refunds/{refund_id}\">.*?</tr>", html, re.S)
    assert found, html
    return found.group()


def test_an_approval_of_less_shows_300_asked_and_250_paid_in_the_api_the_status_and_the_console(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "shown-less-0001", "ord_1002", "The desk is scratched.", amount=Decimal("300.00"))
    assert parked(client, refund_id)["amount"] == "300.00"
    auth = {"Authorization": f"Bearer {APPROVER_KEY}"}
    with web.client(base_url=server.base_url, timeout=30, headers=auth) as http:
        body = {"decision": "approve", "amount": "250.00", "currency": "USD"}
        assert http.post(f"/refunds/{refund_id}/approval", json=body).status_code == 200
        assert wait_for_outcome(client, refund_id, timeout=120)["status"] == "completed"
        [paid] = env.sandbox.refunds("ch_ord_1002")
        assert paid["amount"] == 25000
        one = http.get(f"/refunds/{refund_id}").json()
        assert (one["amount_requested"], one["amount_refunded"], one["currency"]) == ("300.00", "250.00", "USD")
        [item] = [i for i in http.get("/refunds").json()["items"] if i["refund_id"] == refund_id]
        assert (item["amount_requested"], item["amount_refunded"]) == ("300.00", "250.00")
    shown = cli(env, "status", refund_id)
    assert shown.returncode == 0, shown.stderr
    fields = status_fields(shown.stdout)
    assert (fields["asked"], fields["paid"]) == ("300.00 USD", "250.00 USD")
    whole = json.loads(cli(env, "status", refund_id, "--json").stdout)
    assert (whole["amount_requested"], whole["amount_refunded"]) == ("300.00", "250.00")
    with server.signed_in("bob") as bob:
        row = console_row(bob.get("/console").text, refund_id)
        page = bob.get(f"/console/refunds/{refund_id}").text
    assert '<td class="asked">300.00 USD</td>' in row and '<td class="paid">250.00 USD</td>' in row
    assert re.search(r'id="asked">300\.00 USD<', page) and re.search(r'id="amount-paid">250\.00 USD<', page)


def test_a_refund_paid_in_full_shows_the_same_amount_asked_and_paid(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "shown-full-0001", "ord_1001", "The mouse stopped working.", amount=Decimal("42.00"))
    assert result(client, refund_id)["status"] == "completed"
    status, fields = summary_of(client, refund_id)
    assert (status["amount_requested"], status["amount_refunded"]) == ("42.00", "42.00")
    assert (fields["asked"], fields["paid"]) == ("42.00 USD", "42.00 USD")
    assert (listed("ord_1001")["asked"], listed("ord_1001")["paid"]) == ("42.00 USD", "42.00 USD")


def test_a_refused_refund_shows_the_amount_asked_and_nothing_paid(env: Env, client: DBOSClient) -> None:
    """ord_1004's charge is disputed: nothing is refundable, nothing is paid, and no 0.00 reads as a refund."""
    refund_id = submit(client, "shown-refused-01", "ord_1004", "Refund the headphones.", amount=Decimal("60.00"))
    assert result(client, refund_id)["status"] == "rejected"
    status, fields = summary_of(client, refund_id)
    assert (status["amount_requested"], status["amount_refunded"]) == ("60.00", None)
    assert (fields["asked"], fields["paid"]) == ("60.00 USD", "none")
    assert (listed("ord_1004")["asked"], listed("ord_1004")["paid"]) == ("60.00 USD", None)
    page = refund_detail(client, refund_id)
    assert page is not None and page["amount_refunded"] is None
