"""The services a run's look-ups read: the evidence sandbox and the payments sandbox (its risk signals), seeded with
every case's evidence, on free loopback ports in threads of this process, with the evidence steps pointed at them.

Each case has its own orders, tracking codes, charges and customers' emails, so one pair of sandboxes serves every
case of a run. A case whose ``evidence.failing`` names a service gets errors from it for its own look-ups only: a
thin layer in front of the evidence sandbox answers 500 to the requests that name its tracking code or order.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn

from agent.ops.processes import free_port
from proving.evals.cases import DatasetFile
from sandbox import payments
from sandbox.evidence import Credentials, EvidenceSeed, RiskSeed, create_app
from steps import evidence_http
from steps import payments as step_payments

_KEY = "eval-local"  # the sandboxes' own keys: they serve made-up data on loopback only
Receive = Any
Send = Any


class _Served:
    """An ASGI app under uvicorn in a daemon thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _Served:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("a sandbox for the evaluation did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def failing_for(app: Any, codes: set[str], orders: set[str]) -> Any:
    """``app``, except that a tracker request for one of ``codes`` or a return request for one of ``orders`` gets a
    500 (a service that keeps failing for those cases; retried by the steps, then given up)."""

    async def wrapped(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        received, body, more = [], b"", True
        while more:
            message = await receive()
            received.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if _names(scope, body) & (codes | orders):
            start = {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
            await send(start)
            await send({"type": "http.response.body", "body": b'{"error": "failing for this evaluation case"}'})
            return
        replay = iter(received)

        async def again() -> Any:
            return next(replay, None) or await receive()

        await app(scope, again, send)

    return wrapped


def _names(scope: dict[str, Any], body: bytes) -> set[str]:
    """The tracking code or order ids a request asks about."""
    query = parse_qs(scope.get("query_string", b"").decode())
    found = {v for ids in query.get("ReferenceIds", []) for v in ids.split(",")}
    if scope["path"] == "/v2/trackers" and body:
        with suppress(ValueError, KeyError, TypeError):
            found.add(str(json.loads(body)["tracker"]["tracking_code"]))
    return found


def seeds(data: DatasetFile) -> tuple[EvidenceSeed, RiskSeed, set[str], set[str]]:
    """Every case's evidence in one seed each, and the tracking codes and orders whose look-ups fail."""
    trackers, returns, tickets, warnings, disputes = [], [], [], [], []
    codes, orders = set(), set()
    for case in data.cases:
        held, risk = case.evidence.seeds(case.order)
        trackers += held.trackers
        returns += held.returns
        tickets += held.tickets
        warnings += risk.early_fraud_warnings
        disputes += risk.disputes
        if "carrier" in case.evidence.failing:
            codes.add(case.order.tracking)
        if "returns" in case.evidence.failing:
            orders.add(case.order.id)
    held = EvidenceSeed(trackers=trackers, returns=returns, tickets=tickets)
    return held, RiskSeed(early_fraud_warnings=warnings, disputes=disputes), codes, orders


@contextmanager
def evidence_services(data: DatasetFile) -> Iterator[evidence_http.EvidenceConfig]:
    """Both sandboxes, seeded with the dataset's evidence, and the evidence steps configured to read them (quick
    retries: a failing service gives up within a fraction of a second)."""
    held, risk, codes, orders = seeds(data)
    keys = Credentials(carrier_key=_KEY, returns_token=_KEY, tickets_email="evals@example.com", tickets_token=_KEY)
    tmp = Path(tempfile.mkdtemp(prefix="refund-eval-payments-"))
    app = failing_for(create_app(held, credentials=keys), codes, orders)
    ledger = payments.create_app(database_url=f"sqlite:///{tmp / 'payments.sqlite'}", api_key=_KEY, risk_seed=risk)
    try:
        with _Served(app) as services, _Served(ledger) as stripe:
            config = evidence_http.EvidenceConfig(
                carrier_base_url=services.base_url,
                carrier_api_key=_KEY,
                returns_base_url=services.base_url,
                returns_api_key=_KEY,
                tickets_base_url=services.base_url,
                tickets_email="evals@example.com",
                tickets_api_token=_KEY,
                stripe_base_url=stripe.base_url,
                stripe_api_key=_KEY,
                attempts=2,
                backoff_seconds=0.01,
                max_wait_seconds=0.1,
                timeout_seconds=10.0,
            )
            evidence_http.configure(config)
            # The provider's refund list (refunds made outside the service count for the repeat rule) reads the same
            # ledger: nothing is ever paid through it here.
            step_payments.configure(
                step_payments.PaymentsConfig(base_url=stripe.base_url, api_key=_KEY, key_ttl_seconds=86400.0)
            )
            yield config
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
