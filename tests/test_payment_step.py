"""The payment step against the sandbox provider: which failures it retries inside a workflow, which it
never retries, and when it reconciles by metadata instead of trusting the provider to remember the key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import stripe
from dbos import DBOS

from agent import runtime
from steps import payments
from steps.records import ProviderRefund
from tests.conftest import API_KEY, Env

#: Durable name of the test-only workflow that runs the step as the refund workflow does.
PAY_WORKFLOW = "tests.pay_with_the_payment_step"


@DBOS.workflow(name=PAY_WORKFLOW)
def pay_in_a_workflow(refund_id: str, amount: str, first_attempt_at: str) -> dict[str, Any]:
    record = payments.issue_refund_step(
        refund_id=refund_id,
        order_id="ord_1001",
        charge_id="ch_ord_1001",
        amount=Decimal(amount),
        currency="USD",
        first_attempt_at=datetime.fromisoformat(first_attempt_at),
    )
    return record.model_dump(mode="json")


def pay(refund_id: str, amount: str = "42.00", *, first_attempt_at: datetime | None = None) -> ProviderRefund:
    started = (first_attempt_at or datetime.now(UTC)).isoformat()
    return ProviderRefund.model_validate(pay_in_a_workflow(refund_id, amount, started))


def creates(env: Env) -> int:
    return env.sandbox.stats()["create_requests"]


def test_a_provider_failure_is_retried_by_the_step_and_pays_once(env: Env, service: runtime.Runtime) -> None:
    env.sandbox.set_faults(fail_next=2)
    paid = pay("step-retry-0001")
    assert creates(env) == 3
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]
    assert (paid.amount, paid.currency, paid.status) == (Decimal("42.00"), "USD", "succeeded")
    assert paid.idempotency_key == payments.idempotency_key("step-retry-0001", "ord_1001")
    assert not paid.replayed and not paid.reconciled


def test_a_lost_response_is_retried_with_the_same_key_and_replayed(env: Env, service: runtime.Runtime) -> None:
    env.sandbox.set_faults(drop_next=1)
    paid = pay("step-dropped-0001")
    assert creates(env) == 2
    assert paid.replayed and not paid.reconciled
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]


def test_the_same_key_with_another_amount_is_refused_at_once_and_never_retried(
    env: Env, service: runtime.Runtime
) -> None:
    pay("step-conflict-0001", "42.00")
    with pytest.raises(stripe.IdempotencyError):
        pay("step-conflict-0001", "41.00")
    assert creates(env) == 2
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_request_the_provider_rejects_is_not_retried(env: Env, service: runtime.Runtime) -> None:
    with pytest.raises(stripe.InvalidRequestError):
        pay("step-invalid-0001", "0.00")  # the provider refuses a zero amount (400)
    assert creates(env) == 1
    assert env.sandbox.refunds() == []


def test_outside_a_workflow_the_step_calls_the_provider_once(env: Env, service: runtime.Runtime) -> None:
    """The stripe client never retries by itself: the step's DBOS retries, with the same key, are the only ones."""
    env.sandbox.set_faults(fail_next=1)
    with pytest.raises(stripe.APIError):
        payments.issue_refund_step(
            refund_id="step-plain-0001",
            order_id="ord_1001",
            charge_id="ch_ord_1001",
            amount=Decimal("42.00"),
            currency="USD",
            first_attempt_at=datetime.now(UTC),
        )
    assert creates(env) == 1


def test_the_step_reconciles_once_its_first_attempt_is_within_the_margin_of_the_key_ttl(
    env: Env, service: runtime.Runtime
) -> None:
    """With a 60-minute key TTL and a 30-minute margin: 29.5 minutes after the first attempt the key is
    trusted (the provider replays); 30.5 minutes after, the step looks the refund up by metadata."""
    payments.configure(payments.PaymentsConfig(env.sandbox.base_url, API_KEY, key_ttl_seconds=3600))
    first = pay("step-ttl-0001")
    now = datetime.now(UTC)
    trusted = pay("step-ttl-0001", first_attempt_at=now - timedelta(minutes=29, seconds=30))
    looked_up = pay("step-ttl-0001", first_attempt_at=now - timedelta(minutes=30, seconds=30))
    assert (trusted.replayed, trusted.reconciled) == (True, False)
    assert (looked_up.replayed, looked_up.reconciled) == (False, True)
    assert trusted.provider_refund_id == looked_up.provider_refund_id == first.provider_refund_id
    assert creates(env) == 2  # the reconciled attempt created nothing
