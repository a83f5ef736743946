"""One open claim per order, and one claimant across their identities, through real refund workflows on SQLite and
Postgres with the offline model: a second claim on an order whose first is still open waits for a person (or,
decided at the same moment, is refused under the order's lock), and the repeat-claimant rule counts the refunds
of every customer id sharing the order's email, address or card, and refunds made at the provider outside us."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
import stripe
from dbos import DBOSClient

from agent import replies, runtime
from agent.ops.processes import wait_for
from steps.outside_refunds import OUTSIDE_REFUNDS_STEP
from steps.records import email_key
from steps.refunds import PaymentPlan, register_request
from steps.reservations import record_verdict_and_reserve_step
from steps.seed import identity_values
from steps.store import app_db, customers, orders, refunds
from tests.conftest import API_KEY, Env
from tests.identities import HELPDESK
from tests.test_investigation import row, steps_of, told
from tests.test_workflow import chain_ok, parked, result, submit


def test_a_claim_switched_on_an_order_whose_first_claim_waits_is_not_paid_at_once(env: Env, client: DBOSClient) -> None:
    first = submit(client, "switch-first-0001", "ord_1001", "The mouse never arrived.")
    assert decided(first) == "awaiting_customer"  # tracking: delivered, with a photo: the customer is asked
    second = submit(client, "switch-second-001", "ord_1001", "Actually it arrived broken, refund the 42.00.")
    assert decided(second) == "awaiting_approval"
    request = parked(client, second)
    assert f"refund {first} of this order is still open (awaiting customer" in request["reason"]
    assert "claimed as not_received" in request["reason"]
    assert env.sandbox.refunds("ch_ord_1001") == []  # neither claim was paid
    assert row(second).status == "awaiting_approval" and row(second).verdict == "needs_approval"
    assert "A member of our team" in told(second)[0]
    assert chain_ok()


def decided(refund_id: str) -> str:
    """The refund's phase once its workflow has decided it: waiting for a person, or ended."""
    return str(
        wait_for(
            lambda: (phase := row(refund_id).status) not in ("received", "deciding", "paying") and phase,
            timeout=120,
            what=f"{refund_id} to be decided",
        )
    )


def test_a_second_claim_after_the_first_ended_is_judged_on_its_own(env: Env, client: DBOSClient) -> None:
    first = submit(client, "after-first-00001", "ord_1001", "It stopped working.", amount=Decimal("10.00"))
    assert result(client, first)["status"] == "completed"
    second = submit(client, "after-second-0001", "ord_1001", "It stopped working again.", amount=Decimal("5.00"))
    assert result(client, second)["status"] == "completed"
    assert sorted(r["amount"] for r in env.sandbox.refunds("ch_ord_1001")) == [500, 1000]


def _reserve(refund_id: str, amount: str) -> PaymentPlan:
    return record_verdict_and_reserve_step(
        refund_id,
        "ord_1001",
        proposal={"amount": amount, "currency": "USD", "reason": "broken", "customer_reply": "Refunded."},
        verdict={"kind": "auto_approve", "amount": amount, "currency": "USD"},
        model="offline model",
        amount=Decimal(amount),
        currency="USD",
    )


def test_two_claims_on_one_order_reserving_at_once_reserve_once(env: Env, service: runtime.Runtime) -> None:
    """Two claims each judged before the other was on the order (the case file's read missed it) reach the
    reservation together: under the order's lock the earlier claim reserves and the later one is refused."""
    for key in ("at-once-0001", "at-once-0002"):
        register_request(
            refund_id=key,
            order_id="ord_1001",
            request_hash="h",
            currency="USD",
            requested=Decimal("10.00"),
            requester=HELPDESK,
        )
    plans: dict[str, Any] = {}
    start = threading.Barrier(2)

    def reserve(key: str) -> None:
        start.wait()
        try:
            plans[key] = _reserve(key, "10.00")
        except Exception as error:
            plans[key] = error

    threads = [threading.Thread(target=reserve, args=(key,)) for key in ("at-once-0002", "at-once-0001")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    first, second = plans["at-once-0001"], plans["at-once-0002"]
    assert isinstance(first, PaymentPlan) and first.snapshot is not None and first.refusal is None
    assert isinstance(second, PaymentPlan) and second.snapshot is None
    assert second.refusal is not None and "refund at-once-0001 of this order is still open" in second.refusal
    assert replies.plain_reasons([second.refusal]) == [  # the customer is told, in these words, why
        "an earlier refund request for this order is still open, and we answer it first"
    ]
    with app_db().engine.connect() as conn:
        held = dict(conn.execute(sa.select(refunds.c.refund_id, refunds.c.reserved_amount_minor)).all())
    assert held == {"at-once-0001": 1000, "at-once-0002": None}


def _second_identity(*, email: str, address: str, card: str) -> None:
    """cus_ada again, as a new customer id with an order of its own and three refunds in the last days."""
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        key = email_key(email)  # written with the row, as every writer of customers does
        conn.execute(customers.insert().values(customer_id="cus_ada_2", name="A. Lovelace", email=email, email_key=key))
        conn.execute(
            orders.insert().values(
                order_id="ord_2001",
                customer_id="cus_ada_2",
                currency="USD",
                amount_captured_minor=9000,
                amount_refunded_minor=3000,
                status="paid",
                paid_at=now - timedelta(days=4),
                charge_id="ch_ord_2001",
                items=["Mouse pad"],
                **identity_values(address, card),
            )
        )
        for i in range(3):
            at = now - timedelta(days=i + 1)
            conn.execute(
                refunds.insert().values(
                    refund_id=f"second-identity-{i}",
                    order_id="ord_2001",
                    request_hash="h",
                    currency="USD",
                    requested_amount_minor=1000,
                    proposed_amount_minor=1000,
                    status="completed",
                    created_at=at,
                    updated_at=at,
                )
            )


@pytest.mark.parametrize(
    ("identity", "linked_by"),
    [
        ({"email": "  Ada+Shop@Example.COM ", "address": "9 Other Street", "card": "fp_other"}, "email"),
        ({"email": "someone@example.org", "address": "12 ST JAMES'S  square,  London SW1Y 4JH", "card": ""}, "address"),
        ({"email": "someone@example.org", "address": "", "card": "fp_card_ada_visa"}, "card"),
    ],
)
def test_a_claimant_under_a_second_customer_id_is_one_repeat_claimant(
    env: Env, client: DBOSClient, identity: dict[str, str], linked_by: str
) -> None:
    _second_identity(**identity)
    fourth = submit(client, f"linked-{linked_by}-0001", "ord_1001", "It stopped working.", amount=Decimal("1.00"))
    assert decided(fourth) == "awaiting_approval"
    reason = parked(client, fourth)["reason"]
    assert "refund number 4 in the last 30 days" in reason
    assert f"3 under another customer id with the same {linked_by}" in reason
    assert env.sandbox.refunds("ch_ord_1001") == []


def test_refunds_made_at_the_provider_outside_the_service_count_as_refunds(env: Env, client: DBOSClient) -> None:
    provider = stripe.StripeClient(API_KEY, base_addresses={"api": env.sandbox.base_url}, max_network_retries=0)
    for _ in range(3):  # refunds made in the provider's dashboard on another of cus_ada's orders
        provider.v1.refunds.create(params={"charge": "ch_ord_1003", "amount": 100})
    fourth = submit(client, "outside-refunds-01", "ord_1001", "It stopped working.", amount=Decimal("1.00"))
    assert decided(fourth) == "awaiting_approval"
    reason = parked(client, fourth)["reason"]
    assert "refund number 4 in the last 30 days" in reason
    assert "3 made at the payment provider outside this service" in reason
    assert OUTSIDE_REFUNDS_STEP in steps_of(client, fourth)
    assert env.sandbox.refunds("ch_ord_1001") == []
