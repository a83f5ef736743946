"""Settling pending refunds on the sandbox's clock and delivering their events, signed as Stripe signs them."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from sandbox.ledger import Ledger


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context for every sandbox's webhook sender (building one parses the CA bundle, tens of ms)."""
    return httpx.create_ssl_context()


logger = logging.getLogger(__name__)

#: Where the sandbox reads its endpoint secret from when started as a child process (never an argument).
WEBHOOK_SECRET_ENV = "SANDBOX_WEBHOOK_SECRET"  # noqa: S105 (the variable's name, not a secret)
#: Stripe retries a webhook for days; the sandbox gives up on an event after this many attempts.
MAX_DELIVERY_ATTEMPTS = 50


def sign(payload: str, secret: str, timestamp: int) -> str:
    """The ``Stripe-Signature`` header: ``t=<timestamp>,v1=<HMAC-SHA256(secret, "<timestamp>.<payload>")>``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclasses.dataclass
class WebhookTarget:
    """Where events go (PUT /_sandbox/webhook replaces it); no url: events are kept, not sent."""

    url: str | None = None
    secret: str | None = None


class Settler:
    """A background thread: settles pending refunds that fell due and delivers undelivered events. It looks every
    ``interval`` while there is work ahead (a refund pending, an event not yet delivered) and every
    ``idle_interval`` otherwise, or at once when ``wake`` says a pending refund was taken or the target changed."""

    def __init__(
        self,
        ledger: Ledger,
        target: WebhookTarget,
        *,
        clock: Callable[[], float],
        interval: float = 0.1,
        idle_interval: float = 1.0,
    ) -> None:
        self.ledger, self.target, self.clock = ledger, target, clock
        self.interval, self.idle_interval = interval, idle_interval
        self._stop = threading.Event()
        self._woken = threading.Event()
        # The background thread and the admin endpoints both tick: one at a time, or both deliver the same event.
        self._ticking = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sandbox-settler", daemon=True)
        self._http: httpx.Client | None = None  # made at the first delivery: most sandboxes never send one

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Look now: a pending refund was taken, or events have somewhere new to go."""
        self._woken.set()

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()
        self._thread.join(timeout=15)
        if self._http is not None:
            self._http.close()

    def _run(self) -> None:
        busy = True
        while True:
            self._woken.wait(self.interval if busy else self.idle_interval)
            self._woken.clear()  # a wake from here on is seen by the tick below, which reads after it
            if self._stop.is_set():
                return
            try:
                busy = self.tick()
            except Exception:  # a sandbox must keep serving: log and try again next tick
                logger.exception("sandbox settler tick failed")
                busy = True

    def tick(self) -> bool:
        """Settle what fell due and deliver what is undelivered; whether work is left (a refund still pending, an
        event not delivered)."""
        with self._ticking:
            return self._tick()

    def _tick(self) -> bool:
        now = self.clock()
        for refund in self.ledger.due_settlements(now):
            assert refund.settle_to is not None
            if self.ledger.settle(refund.id, refund.settle_to, refund.settle_failure_reason, now=now):
                logger.info("sandbox: refund %s settled %s", refund.id, refund.settle_to)
        undelivered = False
        target = dataclasses.replace(self.target)
        if target.url is not None:
            for event_id, event_type, event in self.ledger.undelivered_events(MAX_DELIVERY_ATTEMPTS):
                delivered = self._deliver(target, event)
                self.ledger.mark_event(event_id, delivered=delivered)
                undelivered = undelivered or not delivered
                logger.info("sandbox: event %s (%s) for %s", event_id, event_type, _object_id(event))
        return undelivered or self.ledger.has_pending_settlements()

    def _deliver(self, target: WebhookTarget, event: dict[str, Any]) -> bool:
        assert target.url is not None
        payload = json.dumps(event)
        headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "Stripe/1.0 (+sandbox)"}
        if target.secret:
            headers["Stripe-Signature"] = sign(payload, target.secret, int(time.time()))
        try:
            if self._http is None:
                self._http = httpx.Client(timeout=10, verify=_tls())
            response = self._http.post(target.url, content=payload, headers=headers)
        except httpx.HTTPError as error:
            logger.info("sandbox: webhook to %s failed: %s", target.url, type(error).__name__)
            return False
        return 200 <= response.status_code < 300


def _object_id(event: dict[str, Any]) -> str:
    return str(event.get("data", {}).get("object", {}).get("id", "?"))
