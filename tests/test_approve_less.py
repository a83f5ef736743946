"""An approver may approve less than a refund asks, never more: over the API, the console (behind its confirmation),
a signed link and the CLI. The approved amount is what is paid, once, and what the customer is told."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent.approval_workflows import decide_here
from agent.domain import ApprovalRecord
from agent.ops.processes import wait_for
from agent.status import wait_for_outcome
from steps.store import app_db, approval_decisions, audit_log, outbox
from tests import web
from tests.conftest import Env
from tests.console_server import ConsoleServer, console_server, csrf_of, form
from tests.identities import add_approver_client, link_token
from tests.test_tools import cli
from tests.test_workflow import parked, submit

APPROVER_KEY = "test-key-of-the-approvals-desk-for-less"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env, approval_limits={"operator:bob": {"USD": Decimal("3000.00")}}) as running:
        add_approver_client(app_db().engine, APPROVER_KEY)
        yield running


def decisions() -> list[tuple[str, int]]:
    with app_db().engine.connect() as conn:
        rows = conn.execute(sa.select(approval_decisions.c.decision, approval_decisions.c.amount_minor))
        return [(r.decision, r.amount_minor) for r in rows]


def told(refund_id: str) -> list[str]:
    """What the customer was sent about the refund's outcome (the outbox's e-mail; the waiting notice before it
    is not about the amount approved)."""
    with app_db().engine.connect() as conn:
        query = sa.select(outbox.c.body).where(outbox.c.message_key == f"{refund_id}:customer")
        return [str(body) for body in conn.execute(query).scalars()]


def decided_entry(refund_id: str) -> dict[str, Any]:
    with app_db().engine.connect() as conn:
        payload = conn.execute(
            sa.select(audit_log.c.payload).where(
                audit_log.c.refund_id == refund_id, audit_log.c.event == "approval_decided"
            )
        ).scalar_one()
    found: dict[str, Any] = json.loads(payload)
    return found


def paid_once(env: Env, client: DBOSClient, refund_id: str, minor: int) -> None:
    """The refund completed with exactly ``minor`` paid, one refund in the provider's ledger."""
    outcome = wait_for_outcome(client, refund_id, timeout=120)
    assert outcome["status"] == "completed", outcome
    [paid] = env.sandbox.refunds("ch_ord_1002")
    assert paid["amount"] == minor and paid["id"] == outcome["provider_refund_id"]


def test_an_api_approval_of_less_is_paid_once_for_that_amount_and_the_customer_is_told_it(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "less-api-0001", "ord_1002")
    assert parked(client, refund_id)["amount"] == "4200.00"
    auth = {"Authorization": f"Bearer {APPROVER_KEY}"}
    with web.client(base_url=server.base_url, timeout=30, headers=auth) as http:
        schema = http.get("/openapi.json").json()["components"]["schemas"]["DecisionIn"]
        assert "amount" in schema["properties"] and schema["required"] == ["decision", "currency"]
        assert "less" in schema["properties"]["amount"]["description"]

        def decide(**body: Any) -> httpx.Response:
            return http.post(f"/refunds/{refund_id}/approval", json={"decision": "approve", "currency": "USD", **body})

        above = decide(amount="4200.01")
        assert above.status_code == 422 and "more than the 4,200.00 USD" in above.json()["detail"]
        assert above.headers["content-type"].startswith("application/problem+json")
        for zero in ("0", "0.00"):
            assert decide(amount=zero).status_code == 422
        decimals = decide(amount="4100.005")
        assert decimals.status_code == 422 and "minor units" in decimals.json()["detail"]
        assert decide(amount="-1.00").status_code == 422
        other = decide(amount="100.00", currency="EUR")
        assert other.status_code == 409 and "awaits 4,200.00 USD" in other.json()["detail"]
        assert decisions() == []  # nothing refused was recorded
        approved = decide(amount="3000.00")
        assert approved.status_code == 200, approved.text
        assert (approved.json()["amount"], approved.json()["first"]) == ("3000.00", True)
        again = decide()  # a repeat (for the awaited amount by default) gets the first decision back
        assert again.status_code == 200 and (again.json()["amount"], again.json()["first"]) == ("3000.00", False)
    paid_once(env, client, refund_id, 300_000)
    with web.client(base_url=server.base_url, timeout=30, headers=auth) as http:
        approval = http.get(f"/refunds/{refund_id}").json()["approval"]
    assert (approval["decision"], approval["approved_amount"], approval["request"]["amount"]) == (
        "approve",
        "3000.00",
        "4200.00",
    )
    [message] = told(refund_id)
    assert "3,000.00 USD" in message and "4,200.00" not in message
    entry = decided_entry(refund_id)
    assert (entry["amount"], entry["asked_amount"], entry["via"]) == ("3000.00", "4200.00", "api")
    assert decisions() == [("approve", 300_000)]


def test_the_console_confirms_the_amount_before_deciding_and_authority_limits_the_amount_approved(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    """bob may approve up to 3,000.00 USD: not the 4,200.00 asked, but 2,500.00 of it."""
    server, client = console
    refund_id = submit(client, "less-console-01", "ord_1002")
    parked(client, refund_id)
    path = f"/console/refunds/{refund_id}/decision"
    with server.signed_in("bob") as bob:
        page = bob.get(f"/console/refunds/{refund_id}")
        assert 'id="approve-amount" value="4200.00"' in page.text  # prefilled with the amount asked
        token = csrf_of(bob, f"/console/refunds/{refund_id}")
        fields = {"asked": "4200.00", "currency": "USD", "csrf": token}
        over_limit = form(bob, path, decision="approve", amount="4200.00", **fields)
        assert over_limit.status_code == 403 and "may approve up to 3,000.00 USD" in over_limit.text
        for wrong, why in (("4300.00", "more than the 4,200.00 USD"), ("0", "more than 0"), ("12.345", "minor units")):
            refused = form(bob, path, decision="approve", amount=wrong, **fields)
            assert refused.status_code == 400 and why in refused.text, wrong
        assert form(bob, path, decision="approve", amount="lots", **fields).status_code == 400
        reject = form(bob, path, decision="reject", amount="4200.00", **fields)
        assert reject.status_code == 200 and f"Reject refund {refund_id} of 4,200.00 USD?" in reject.text
        confirm = form(bob, path, decision="approve", amount="2500", **fields)
        assert confirm.status_code == 200
        question = f"Approve 2,500.00 USD for refund {refund_id} instead of the 4,200.00 USD asked?"
        assert question in confirm.text and 'name="confirmed" value="yes"' in confirm.text
        assert decisions() == []  # nothing is decided until the confirmation is posted
        forged = form(bob, path, decision="approve", amount="2500.00", **{**fields, "csrf": "forged"}, confirmed="yes")
        assert forged.status_code == 403 and decisions() == []
        done = form(bob, path, decision="approve", amount="2500.00", **fields, confirmed="yes")
        assert done.status_code == 303 and done.headers["location"].endswith("?done=approve")
    paid_once(env, client, refund_id, 250_000)
    assert "2,500.00 USD" in told(refund_id)[0]
    assert decisions() == [("approve", 250_000)]


def test_a_signed_link_approves_less_than_it_names_never_more(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, client = console
    refund_id = submit(client, "less-link-0001", "ord_1002")
    parked(client, refund_id)
    token = wait_for(lambda: link_token(app_db().engine, refund_id, "ada"), timeout=10, what="ada's approval link")
    with web.client(base_url=server.base_url, timeout=30) as http:
        page = http.get(f"/approve/{token}")
        assert page.status_code == 200 and "id='amount' value='4200.00'" in page.text
        more = http.post(f"/approve/{token}", content="decision=approve&amount=4200.50", headers={"Content-Type": FORM})
        assert more.status_code == 422 and "more than the 4,200.00 USD" in more.text and decisions() == []
        less = http.post(f"/approve/{token}", content="decision=approve&amount=1234.56", headers={"Content-Type": FORM})
        assert less.status_code == 200 and "approve for 1,234.56 USD by operator:ada" in less.text
    paid_once(env, client, refund_id, 123_456)
    assert "1,234.56 USD" in told(refund_id)[0]


def test_the_cli_approves_less_with_amount_and_refuses_more(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "less-cli-00001", "ord_1002")
    parked(client, refund_id)
    more = cli(env, "approve", refund_id, "--amount", "5000")
    assert more.returncode == 2 and "more than the 4,200.00 USD" in more.stderr, more.stderr
    approved = cli(env, "approve", refund_id, "--amount", "4000.00")
    assert approved.returncode == 0 and "for 4000.00 USD" in approved.stdout, approved.stderr
    paid_once(env, client, refund_id, 400_000)
    assert "4,000.00 USD" in told(refund_id)[0]


def test_a_recorded_approval_above_its_request_pays_nothing(env: Env, client: DBOSClient) -> None:
    """Past every channel's check (a decision recorded by hand): the payment step refuses more than was asked."""
    refund_id = submit(client, "less-forged-001", "ord_1002")
    parked(client, refund_id)
    forged = ApprovalRecord(
        refund_id=refund_id,
        decision="approve",
        approver="operator:dana",
        amount=Decimal("4200.01"),
        currency="USD",
        decided_at=datetime.now(UTC),
        via="console",
    )
    assert decide_here(forged) == forged
    outcome = wait_for_outcome(client, refund_id, timeout=120)
    assert outcome["status"] == "rejected", outcome
    assert outcome["detail"] == "the approval is for 4200.01 USD but the request was for at most 4200.00 USD"
    assert env.sandbox.refunds() == []
