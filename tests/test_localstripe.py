"""The payment step's wire format against localstripe, a Stripe fake nobody here wrote (PyPI, started by the
test): create, the charge's retrieve, the list by charge and a refund's retrieve, on the subset it implements.

localstripe keeps no idempotency keys and no refund statuses but ``succeeded``, so only the calls'
shapes are checked here; our own sandbox covers those semantics (tests/test_sandbox_payments.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe

from agent import runtime
from agent.ops.processes import free_port, stop, wait_for
from steps import payments
from tests import web
from tests.conftest import API_KEY


def answers(url: str) -> bool:
    try:
        return web.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _up_or_exited(proc: subprocess.Popen[bytes], base: str) -> bool:
    """True once it answers; False when it exited first."""
    wait_for(lambda: answers(f"{base}/v1/balance") or proc.poll() is not None, timeout=30, what="localstripe")
    return proc.poll() is None


def _started(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """localstripe on a free port; on another one when something took that port first (it exits: address in use)."""
    for _ in range(5):
        port = free_port()
        with log.open("ab") as out:
            command = [str(Path(sys.executable).parent / "localstripe"), "--port", str(port)]
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        if _up_or_exited(proc, base):
            return proc, base
    raise AssertionError(f"localstripe did not start:\n{log.read_text(errors='replace')[-2000:]}")


@pytest.fixture
def localstripe(tmp_path: Path) -> Iterator[str]:
    proc, base = _started(tmp_path / "localstripe.log")
    try:
        yield base
    finally:
        stop(proc, 10)


def charge(base: str, amount: int, currency: str) -> str:
    """A card charge at localstripe, made as a shop would: a payment method, then a charge on it."""
    client = stripe.StripeClient(API_KEY, base_addresses={"api": base}, max_network_retries=0)
    card: Any = {"number": "4242424242424242", "exp_month": 12, "exp_year": datetime.now(UTC).year + 2, "cvc": "123"}
    method = client.v1.payment_methods.create(params={"type": "card", "card": card})
    made = client.v1.charges.create(params={"amount": amount, "currency": currency, "source": method.id})
    assert made.status == "succeeded"
    return made.id


def test_the_payment_steps_calls_are_understood_by_localstripe(localstripe: str, service: runtime.Runtime) -> None:
    payments.configure(payments.PaymentsConfig(localstripe, API_KEY, key_ttl_seconds=86400))
    charge_id = charge(localstripe, 4200, "usd")
    now = datetime.now(UTC)
    args = {"order_id": "ord_1001", "charge_id": charge_id, "currency": "USD"}

    paid = payments.issue_refund_step(refund_id="interop-0001", amount=Decimal("12.50"), first_attempt_at=now, **args)
    assert (paid.amount, paid.currency, paid.status) == (Decimal("12.50"), "USD", "succeeded")
    assert paid.provider_refund_id.startswith("re_") and paid.failure_reason is None

    again = payments.fetch_refund(paid.provider_refund_id, paid.idempotency_key)  # GET /v1/refunds/{id}
    assert (again.provider_refund_id, again.amount, again.status) == (paid.provider_refund_id, paid.amount, "succeeded")

    payments.issue_refund_step(refund_id="interop-0002", amount=Decimal("1.00"), first_attempt_at=now, **args)
    key = payments.idempotency_key("interop-0001", "ord_1001")
    found = payments.find_refund(charge_id, key)  # GET /v1/refunds?charge=...: metadata matched by us
    assert found is not None and found.id == paid.provider_refund_id

    # Long after the first attempt the step reconciles through the same list instead of creating again.
    old = now - timedelta(days=2)
    held = payments.issue_refund_step(refund_id="interop-0001", amount=Decimal("12.50"), first_attempt_at=old, **args)
    assert held.reconciled and held.provider_refund_id == paid.provider_refund_id
    client = stripe.StripeClient(API_KEY, base_addresses={"api": localstripe}, max_network_retries=0)
    assert len(client.v1.refunds.list(params={"charge": charge_id, "limit": 100}).data) == 2
    assert client.v1.charges.retrieve(charge_id).amount_refunded == 1350


def test_a_charge_in_another_currency_is_refused_before_localstripe_is_asked_to_refund(
    localstripe: str, service: runtime.Runtime
) -> None:
    payments.configure(payments.PaymentsConfig(localstripe, API_KEY, key_ttl_seconds=86400))
    charge_id = charge(localstripe, 900, "eur")
    with pytest.raises(payments.PaymentRefused, match="is in EUR, the order in USD"):
        payments.issue_refund_step(
            refund_id="interop-0003",
            order_id="ord_1001",
            charge_id=charge_id,
            amount=Decimal("9.00"),
            currency="USD",
            first_attempt_at=datetime.now(UTC),
        )
    client = stripe.StripeClient(API_KEY, base_addresses={"api": localstripe}, max_network_retries=0)
    assert client.v1.refunds.list(params={"charge": charge_id}).data == []
