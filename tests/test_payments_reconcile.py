"""When the provider has forgotten an idempotency key, the payment step reconciles instead of paying again."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from agent import runtime
from sandbox.ledger_records import Charge
from steps import payments
from steps.records import ProviderRefund
from tests.conftest import API_KEY, Env, SandboxServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def forgetful(tmp_path: Path) -> Iterator[tuple[SandboxServer, Clock]]:
    clock = Clock()
    charge = Charge("ch_ord_1001", amount=8400, currency="usd")  # room for the second refund one test shows
    server = SandboxServer(f"sqlite:///{tmp_path}/forgetful.sqlite", key_ttl_seconds=60, clock=clock, charges=[charge])
    yield server, clock
    server.close()


def pay(first_attempt_at: datetime) -> ProviderRefund:
    return payments.issue_refund_step(
        refund_id="ttl-refund-1",
        order_id="ord_1001",
        charge_id="ch_ord_1001",
        amount=Decimal("42.00"),
        currency="USD",
        first_attempt_at=first_attempt_at,
    )


def test_retry_after_key_expiry_finds_the_first_refund(
    env: Env, service: runtime.Runtime, forgetful: tuple[SandboxServer, Clock]
) -> None:
    server, clock = forgetful
    payments.configure(payments.PaymentsConfig(server.base_url, API_KEY, key_ttl_seconds=60))
    started = datetime.now(UTC)
    first = pay(started)
    clock.now += 3600  # the provider forgets the key
    again = pay(started - timedelta(hours=1))  # the step knows its first attempt is older than the TTL
    assert again.reconciled and again.provider_refund_id == first.provider_refund_id
    assert len(server.refunds("ch_ord_1001")) == 1


def test_without_reconciliation_an_expired_key_would_pay_twice(
    env: Env, service: runtime.Runtime, forgetful: tuple[SandboxServer, Clock]
) -> None:
    """The provider's side of the contract, shown plainly: after the TTL a key no longer protects."""
    server, clock = forgetful
    payments.configure(payments.PaymentsConfig(server.base_url, API_KEY, key_ttl_seconds=10**9))
    started = datetime.now(UTC)
    first = pay(started)
    clock.now += 3600
    second = pay(started)
    assert second.provider_refund_id != first.provider_refund_id
    assert len(server.refunds("ch_ord_1001")) == 2


def test_same_key_within_ttl_is_replayed(env: Env, service: runtime.Runtime) -> None:
    first = pay(datetime.now(UTC))
    again = pay(datetime.now(UTC))
    assert again.replayed and again.provider_refund_id == first.provider_refund_id
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1
