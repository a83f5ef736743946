"""The payment step against the sandbox provider: which failures it retries inside a workflow, which it
never retries, and when it reconciles by metadata instead of trusting the provider to remember the key."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
import stripe
from dbos import DBOS
from fastapi import FastAPI

from agent import runtime
from agent.ops.processes import wait_for
from sandbox.ledger_records import Claimed
from steps import payments
from steps.records import ProviderRefund
from tests.conftest import API_KEY, Env, SandboxServer

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


def test_saved_provider_500s_move_on_to_the_next_attempt_key_only_once_nothing_is_held_and_pay_once(
    env: Env, service: runtime.Runtime
) -> None:
    """Stripe replays a saved 500 for its key: each retry lists the charge's refunds, finds none of ours,
    and only then spends the next key; the third key is paid, once."""
    env.sandbox.set_faults(fail_next=2)
    paid = pay("step-retry-0001")
    # attempt 1: key 0 (500); attempt 2: key 0 (replayed 500), key 1 (500); attempt 3: keys 0 and 1 replayed, key 2
    assert creates(env) == 6
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]
    assert (paid.amount, paid.currency, paid.status) == (Decimal("42.00"), "USD", "succeeded")
    assert paid.idempotency_key == payments.attempt_key("step-retry-0001", "ord_1001", 2)
    metadata = env.sandbox.refunds("ch_ord_1001")[0]["metadata"]
    assert metadata["idempotency_key"] == payments.idempotency_key("step-retry-0001", "ord_1001")
    assert not paid.replayed and not paid.reconciled


def test_a_saved_500_left_by_an_earlier_run_is_found_replayed_and_paid_under_the_next_key(
    env: Env, service: runtime.Runtime
) -> None:
    """A run that got a saved 500 and died (here: a call outside a workflow) leaves the key spent; the next
    run sees the replay, lists the charge's refunds, finds nothing of ours, and pays under key 1."""
    env.sandbox.set_faults(fail_next=1)
    with pytest.raises(stripe.APIError):
        payments.issue_refund_step(
            refund_id="step-saved-0001",
            order_id="ord_1001",
            charge_id="ch_ord_1001",
            amount=Decimal("42.00"),
            currency="USD",
            first_attempt_at=datetime.now(UTC),
        )
    paid = pay("step-saved-0001")
    assert paid.idempotency_key == payments.attempt_key("step-saved-0001", "ord_1001", 1)
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]
    assert creates(env) == 3


def test_a_refund_larger_than_what_is_left_on_the_charge_gets_stripes_error_and_no_retry(
    env: Env, service: runtime.Runtime
) -> None:
    """Our reservation is bypassed here (the step is called directly): the provider's own check answers."""
    with pytest.raises(stripe.InvalidRequestError) as raised:
        pay("step-too-large-0001", "42.01")
    assert raised.value.code == "amount_too_large"
    assert payments.describe_failure(raised.value) == "InvalidRequestError: amount_too_large"
    assert creates(env) == 1 and env.sandbox.refunds("ch_ord_1001") == []


def test_a_charge_with_an_open_dispute_is_a_refusal_never_retried(env: Env, service: runtime.Runtime) -> None:
    """ch_ord_1017 has an open dispute (the demo's risk seed): the provider answers 400 charge_disputed, which the
    step raises as ChargeDisputed, a refusal its retries never repeat."""
    with pytest.raises(payments.ChargeDisputed):
        payments.issue_refund_step(
            refund_id="step-disputed-0001",
            order_id="ord_1017",
            charge_id="ch_ord_1017",
            amount=Decimal("10.00"),
            currency="USD",
            first_attempt_at=datetime.now(UTC),
        )
    assert not payments.PROVIDER_RETRIES["should_retry"](payments.ChargeDisputed("x"))
    assert creates(env) == 1 and env.sandbox.refunds("ch_ord_1017") == []


def test_a_charge_in_another_currency_than_the_order_is_refused_before_anything_is_created(
    env: Env, service: runtime.Runtime
) -> None:
    with pytest.raises(payments.PaymentRefused, match="charge ch_ord_1003 is in EUR, the order in USD"):
        payments.issue_refund_step(
            refund_id="step-currency-0001",
            order_id="ord_1003",
            charge_id="ch_ord_1003",
            amount=Decimal("10.00"),
            currency="USD",
            first_attempt_at=datetime.now(UTC),
        )
    assert creates(env) == 0


def test_a_lost_response_is_settled_by_listing_the_charges_refunds_not_by_creating_again(
    env: Env, service: runtime.Runtime
) -> None:
    env.sandbox.set_faults(drop_next=1)
    paid = pay("step-dropped-0001")
    assert creates(env) == 1
    assert paid.reconciled and not paid.replayed
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]


def test_the_same_key_with_another_amount_is_refused_at_once_and_never_retried(
    env: Env, service: runtime.Runtime
) -> None:
    pay("step-conflict-0001", "42.00")
    with pytest.raises(payments.PaymentRefused, match=r"holds .* for 42\.00 USD under this key"):
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


def test_a_key_another_request_holds_in_flight_is_retried_until_it_is_free(
    env: Env, service: runtime.Runtime, tmp_path: Path
) -> None:
    """The provider answers 409 while another request with the key is in flight; the step waits and retries, and
    pays once the other request has let the key go."""
    server = SandboxServer(f"sqlite:///{tmp_path}/inflight.sqlite")
    try:
        payments.configure(payments.PaymentsConfig(server.base_url, API_KEY, key_ttl_seconds=86400))
        key = payments.idempotency_key("step-in-flight-0001", "ord_1001")
        ledger = cast(FastAPI, server.server.config.app).state.ledger  # a request that holds the key, in flight
        held = ledger.claim_key(key, "another request", now=time.time(), ttl_seconds=86400, stale_after_seconds=3600)
        assert isinstance(held, Claimed)

        def let_go_once_refused() -> None:  # the other request ends once the step has met its claim
            wait_for(lambda: server.stats()["create_requests"] >= 1, timeout=60, what="the step's first request")
            ledger.release_key(key, held.token)

        releaser = threading.Thread(target=let_go_once_refused, daemon=True)
        releaser.start()
        paid = pay("step-in-flight-0001")
        releaser.join(10)
        assert server.stats()["create_requests"] == 2
        assert [r["id"] for r in server.refunds("ch_ord_1001")] == [paid.provider_refund_id]
    finally:
        server.close()


UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 58\r\n"
    b'Connection: close\r\n\r\n{"error": {"type": "api_error", "message": "unavailable"}}'
)


class FlakyFront:
    """A loopback front for the sandbox whose first connection fails (closed unanswered, a network blip, or
    answered 503 by a gateway), then relays every later one to the sandbox."""

    def __init__(self, upstream_port: int, first: str) -> None:
        self.upstream_port, self.first = upstream_port, first
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.failed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.failed == 0:
                self.failed += 1
                if self.first == "503":
                    with contextlib.suppress(OSError):
                        conn.recv(65536)
                        conn.sendall(UNAVAILABLE)
                conn.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._relay, args=(src, dst), daemon=True).start()

    @staticmethod
    def _relay(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture(params=["drop", "503"])
def flaky(env: Env, request: pytest.FixtureRequest) -> Iterator[FlakyFront]:
    front = FlakyFront(env.sandbox.port, first=request.param)
    yield front
    front.listener.close()


def test_a_dropped_connection_or_an_unavailable_gateway_is_retried_by_the_step_and_pays_once(
    env: Env, service: runtime.Runtime, flaky: FlakyFront
) -> None:
    payments.configure(payments.PaymentsConfig(f"http://127.0.0.1:{flaky.port}", API_KEY, key_ttl_seconds=86400))
    paid = pay("step-flaky-0001")
    assert flaky.failed == 1
    assert creates(env) == 1
    assert [r["id"] for r in env.sandbox.refunds("ch_ord_1001")] == [paid.provider_refund_id]


def test_reconciling_finds_this_requests_refund_among_the_others_on_the_charge(
    env: Env, service: runtime.Runtime
) -> None:
    """Several refund requests on one order share its charge; the lookup by metadata matches the key exactly."""
    payments.configure(payments.PaymentsConfig(env.sandbox.base_url, API_KEY, key_ttl_seconds=3600))
    ours = pay("step-many-m", "14.00")
    others = {pay(refund_id, "14.00").provider_refund_id for refund_id in ("step-many-a", "step-many-z")}  # newer
    again = pay("step-many-m", "14.00", first_attempt_at=datetime.now(UTC) - timedelta(hours=2))
    assert again.reconciled and again.provider_refund_id == ours.provider_refund_id
    assert again.provider_refund_id not in others
    assert creates(env) == 3
