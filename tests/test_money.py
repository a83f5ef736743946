"""Money as ISO 4217 says: minor units and formatting from CLDR (Babel), limits per currency, a zero-decimal (JPY)
and a three-decimal (KWD) order through policy, payment and display."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from pydantic import ValidationError

from agent import approvals
from agent.approval_workflows import decide_here
from agent.console.data import RefundFilter, list_refunds, pending_approvals
from agent.domain import RefundRequest
from agent.policy import Limits, decide
from agent.settings import Settings
from agent.status import refund_status
from agent.submit import SubmissionError
from steps.records import exponent, format_money, from_minor, minor_unit_problem, to_minor
from steps.store import app_db, audit_log, outbox
from tests import web
from tests.conftest import API_KEY, Env
from tests.identities import DANA
from tests.test_policy import NOW, order
from tests.test_workflow import parked, result, submit


@pytest.mark.parametrize(
    ("currency", "places", "amount", "shown"),
    [
        ("USD", 2, "12000", "12,000.00 USD"),
        ("USD", 2, "0.5", "0.50 USD"),
        ("EUR", 2, "1234.5", "1,234.50 EUR"),
        ("JPY", 0, "15000", "15,000 JPY"),
        ("JPY", 0, "1500000", "1,500,000 JPY"),
        ("KWD", 3, "1.25", "1.250 KWD"),
        ("KWD", 3, "3000", "3,000.000 KWD"),
    ],
)
def test_minor_units_and_format_come_from_the_currency(currency: str, places: int, amount: str, shown: str) -> None:
    assert exponent(currency) == places
    assert format_money(Decimal(amount), currency) == shown
    minor = to_minor(Decimal(amount), currency)
    assert minor == int(Decimal(amount) * 10**places)
    assert from_minor(minor, currency) == Decimal(amount)
    assert str(from_minor(minor, currency)).count(".") == (1 if places else 0)


@pytest.mark.parametrize(
    ("amount", "currency", "problem"),
    [
        ("15000", "JPY", None),
        ("15000.5", "JPY", "JPY has no minor unit (0 decimal places)"),
        ("10.001", "USD", "USD has 2 decimal places"),
        ("1.250", "KWD", None),
        ("1.2505", "KWD", "KWD has 3 decimal places"),
        ("1.255", "KWD", "KWD refunds move in steps of 0.010 KWD"),  # Stripe takes only whole tens of fils
    ],
)
def test_an_amount_finer_than_its_currency_pays_is_named(amount: str, currency: str, problem: str | None) -> None:
    found = minor_unit_problem(Decimal(amount), currency)
    assert found == problem if problem is None else problem in (found or "")


def test_a_request_names_the_minor_units_of_its_currency() -> None:
    with pytest.raises(ValidationError, match=r"finer than JPY allows: JPY has no minor unit"):
        RefundRequest(order_id="ord_1006", message="refund", amount=Decimal("15000.5"), currency="JPY")
    with pytest.raises(ValidationError, match=r"steps of 0\.010 KWD"):
        RefundRequest(order_id="ord_1018", message="refund", amount=Decimal("1.255"), currency="KWD")
    assert RefundRequest(order_id="ord_1018", message="refund", amount=Decimal("1.250"), currency="KWD")


def limits_of(settings: Settings) -> Limits:
    """The limits as ``runtime.start`` builds them."""
    return Limits(
        auto_approve=settings.policy.auto_approve_limit,
        absolute_cap=settings.policy.absolute_refund_cap,
        window_days=settings.policy.refund_window_days,
        auto_approve_by_currency=settings.policy.auto_approve_limits,
        absolute_cap_by_currency=settings.policy.absolute_refund_caps,
        customer_max_amount=settings.policy.customer_max_refund_amount,
        customer_max_amount_by_currency=settings.policy.customer_max_refund_amounts,
        scales=settings.policy.limit_scales,
    )


def test_default_limits_make_sense_in_every_currency_shipped() -> None:
    limits = limits_of(Settings())
    table = {c: (limits.auto_approve_for(c), limits.absolute_cap_for(c)) for c in ("USD", "EUR", "JPY", "KWD")}
    assert {c: (format_money(a, c), format_money(b, c)) for c, (a, b) in table.items()} == {
        "USD": ("100.00 USD", "10,000.00 USD"),
        "EUR": ("100.00 EUR", "10,000.00 EUR"),
        "JPY": ("15,000 JPY", "1,500,000 JPY"),
        "KWD": ("30.000 KWD", "3,000.000 KWD"),
    }


def test_a_per_currency_limit_from_the_environment_wins_over_the_scaled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTO_APPROVE_LIMITS", '{"JPY": 20000}')
    monkeypatch.setenv("LIMIT_SCALES", '{"KWD": "0.31"}')
    limits = limits_of(Settings())
    assert limits.auto_approve_for("JPY") == Decimal(20000)
    assert limits.auto_approve_for("KWD") == Decimal("31.000")
    assert limits.absolute_cap_for("JPY") == Decimal(1500000)  # the scales not given keep their defaults
    monkeypatch.setenv("AUTO_APPROVE_LIMITS", '{"JPY": "150.5"}')
    with pytest.raises(ValidationError, match="finer than JPY's minor unit"):
        Settings()


@pytest.mark.parametrize(
    ("currency", "captured", "amount", "kind", "reasons"),
    [
        ("JPY", "15000", "15000", "auto_approve", []),  # about 100 USD, as the demo's ord_1006
        ("JPY", "20000", "20000", "needs_approval", ["amount is above the auto-approve limit of 15,000 JPY"]),
        (
            "JPY",
            "1600000",
            "1600000",
            "refuse",
            ["amount 1,600,000 JPY is above the absolute cap of 1,500,000 JPY"],
        ),
        (
            "JPY",
            "20000",
            "100.5",
            "refuse",
            ["amount 100.5 is finer than JPY allows: JPY has no minor unit (0 decimal places)"],
        ),
        ("KWD", "45.750", "1.250", "auto_approve", []),
        ("KWD", "45.750", "40.000", "needs_approval", ["amount is above the auto-approve limit of 30.000 KWD"]),
        (
            "KWD",
            "45.750",
            "1.255",
            "refuse",
            ["amount 1.255 cannot be paid in KWD: KWD refunds move in steps of 0.010 KWD"],
        ),
    ],
)
def test_policy_judges_and_words_each_currency_in_its_own_units(
    currency: str, captured: str, amount: str, kind: str, reasons: list[str]
) -> None:
    limits = limits_of(Settings())
    verdict = decide(
        amount=Decimal(amount),
        currency=currency,
        order=order(currency=currency, captured=captured, days=3),
        as_of=NOW,
        limits=limits,
    )
    assert (verdict.kind, list(verdict.reasons)) == (kind, reasons)


def sent(refund_id: str) -> list[str]:
    with app_db().engine.connect() as conn:
        return [r.body for r in conn.execute(sa.select(outbox).where(outbox.c.refund_id == refund_id))]


def verdict_reasons(refund_id: str) -> list[str]:
    """The reasons of the verdict policy recorded (the audit log's ``policy_verdict`` entry)."""
    query = sa.select(audit_log.c.payload).where(
        audit_log.c.refund_id == refund_id, audit_log.c.event == "policy_verdict"
    )
    with app_db().engine.connect() as conn:
        [payload] = conn.execute(query).scalars()
    return list((json.loads(payload) if isinstance(payload, str) else payload)["reasons"])


def shown(client: DBOSClient, refund_id: str) -> str:
    """Everything the refund shows people: the API's status document and the messages sent."""
    return json.dumps(refund_status(client, refund_id)) + "\n".join(sent(refund_id))


def test_the_demo_yen_order_is_paid_as_about_100_usd_and_shown_without_decimals(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "money-jpy-0001", "ord_1006", "The tea set arrived broken.")
    assert result(client, refund_id)["status"] == "completed"
    [paid] = env.sandbox.refunds("ch_ord_1006")
    assert (paid["amount"], paid["currency"]) == (15000, "jpy")
    status = refund_status(client, refund_id)
    assert status is not None and status["amount"] == "15000" and status["amount_refunded"] == "15000"
    text = shown(client, refund_id)
    assert "15000" in text and not re.search(r"15,?000\.0", text), text
    [row], _ = list_refunds(RefundFilter(order="ord_1006"))
    assert (row["asked"], row["paid"]) == (None, "15,000 JPY")  # no amount named; paid in whole yen
    with pytest.raises(SubmissionError, match="JPY has no minor unit"):
        submit(client, "money-jpy-0002", "ord_1006", amount=Decimal("10.5"))


def test_a_three_decimal_order_round_trips_through_policy_payment_and_display(env: Env, client: DBOSClient) -> None:
    small = submit(client, "money-kwd-0001", "ord_1018", "The lantern arrived dented.", amount=Decimal("1.25"))
    assert result(client, small)["status"] == "completed"
    [paid] = env.sandbox.refunds("ch_ord_1018")
    assert (paid["amount"], paid["currency"]) == (1250, "kwd")  # fils, a multiple of 10 as Stripe wants
    status = refund_status(client, small)
    assert status is not None and status["amount"] == "1.250"
    assert (status["amount_requested"], status["amount_refunded"]) == ("1.250", "1.250")
    assert any("1.250 KWD" in body for body in sent(small)) or "1.250" in shown(client, small)

    large = submit(client, "money-kwd-0002", "ord_1018", "It is broken.", amount=Decimal("40"))
    request = parked(client, large)
    assert (request["amount"], request["currency"]) == ("40.000", "KWD")
    [approver_message] = [b for b in sent(large) if "needs approval" in b]
    assert "40.000 KWD" in approver_message
    assert verdict_reasons(large) == ["amount is above the auto-approve limit of 30.000 KWD"]
    waiting = [p for p in pending_approvals(client, datetime.now(UTC)) if p["refund_id"] == large]
    assert [p["money"] for p in waiting] == ["40.000 KWD"]
    with pytest.raises(approvals.ApprovalError, match=r"steps of 0\.010 KWD"):  # Stripe would refuse 39995 fils
        approvals.decide(
            decide_here,
            refund_id=large,
            decision="approve",
            approver=DANA,
            via="console",
            amount=Decimal("39.995"),
            currency="KWD",
        )
    decided = approvals.decide(
        decide_here,
        refund_id=large,
        decision="approve",
        approver=DANA,
        via="console",
        amount=Decimal("40.000"),
        currency="KWD",
    )
    assert decided.first
    assert result(client, large)["status"] == "completed"
    assert sorted(r["amount"] for r in env.sandbox.refunds("ch_ord_1018")) == [1250, 40000]
    with pytest.raises(SubmissionError, match=r"steps of 0\.010 KWD"):
        submit(client, "money-kwd-0003", "ord_1018", amount=Decimal("1.255"))


def test_the_payments_sandbox_refuses_a_three_decimal_amount_stripe_would(env: Env) -> None:
    def refund(minor: int) -> httpx.Response:
        body = {"charge": "ch_ord_1018", "amount": str(minor)}
        return web.post(env.sandbox.base_url + "/v1/refunds", data=body, headers={"Authorization": f"Bearer {API_KEY}"})

    refused = refund(1255)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "amount"
    assert "multiple of 10" in refused.json()["error"]["message"]
    assert env.sandbox.refunds("ch_ord_1018") == []
    assert refund(1250).status_code == 200
    assert [r["amount"] for r in env.sandbox.refunds("ch_ord_1018")] == [1250]
