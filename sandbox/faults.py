"""Fault knobs for the payments sandbox: saved errors, latency, lost responses and refunds that settle late
or fail; seeded."""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Literal

#: Stripe's refund failure reasons the sandbox may give.
FAILURE_REASONS = frozenset(
    {
        "charge_for_pending_refund_disputed",
        "declined",
        "expired_or_canceled_card",
        "insufficient_funds",
        "lost_or_stolen_card",
        "merchant_request",
        "unknown",
    }
)

Fault = Literal["fail", "drop"]
Lifecycle = Literal["succeeded", "pending_succeeded", "pending_failed"]


@dataclasses.dataclass
class Faults:
    """Fault knobs for POST /v1/refunds; held per process (PUT /_sandbox/faults replaces them)."""

    fail_rate: float = 0.0  # probability of a 500, saved for the key (as Stripe does) with nothing applied
    latency_ms: int = 0  # sleep before handling each create
    drop_response_rate: float = 0.0  # probability of applying, then answering 500 "response lost"
    fail_next: int = 0  # the next N creates fail (deterministic, checked before the rates)
    drop_next: int = 0  # the next N creates are applied but their response is dropped
    pending_rate: float = 0.0  # probability that a refund is created `pending` (it settles later)
    pending_fail_share: float = 0.0  # of those, the share that then fails instead of succeeding
    pending_next: int = 0  # the next N refunds are created pending and then succeed
    pending_fail_next: int = 0  # the next N refunds are created pending and then fail
    settle_after_ms: int = 1000  # how long a pending refund stays pending (-1: until settled by hand)
    failure_reason: str = "expired_or_canceled_card"  # the reason a failing refund gives
    seed: int | None = None

    def __post_init__(self) -> None:
        rates = (self.fail_rate, self.drop_response_rate, self.pending_rate, self.pending_fail_share)
        if not all(0.0 <= rate <= 1.0 for rate in rates):
            raise ValueError("fault rates must be between 0 and 1")
        counts = (self.latency_ms, self.fail_next, self.drop_next, self.pending_next, self.pending_fail_next)
        if min(counts) < 0 or self.settle_after_ms < -1:
            raise ValueError("latency, counts and settle_after_ms must not be negative (settle_after_ms: -1 or more)")
        if self.failure_reason not in FAILURE_REASONS:
            raise ValueError(f"failure_reason must be one of {', '.join(sorted(FAILURE_REASONS))}")


class FaultInjector:
    """Process-local fault state; the lock keeps the counters exact under concurrent requests."""

    def __init__(self, faults: Faults) -> None:
        self._lock = threading.Lock()
        self.replace(faults)

    def replace(self, faults: Faults) -> None:
        with self._lock:
            self._faults = dataclasses.replace(faults)
            self._rng = random.Random(faults.seed)

    def snapshot(self) -> Faults:
        with self._lock:
            return dataclasses.replace(self._faults)

    def decide(self) -> Fault | None:
        with self._lock:
            f = self._faults
            if f.fail_next > 0:
                f.fail_next -= 1
                return "fail"
            if f.drop_next > 0:
                f.drop_next -= 1
                return "drop"
            if f.fail_rate > 0 and self._rng.random() < f.fail_rate:
                return "fail"
            if f.drop_response_rate > 0 and self._rng.random() < f.drop_response_rate:
                return "drop"
            return None

    def lifecycle(self) -> Lifecycle:
        """How the refund about to be created will settle."""
        with self._lock:
            f = self._faults
            if f.pending_next > 0:
                f.pending_next -= 1
                return "pending_succeeded"
            if f.pending_fail_next > 0:
                f.pending_fail_next -= 1
                return "pending_failed"
            if f.pending_rate > 0 and self._rng.random() < f.pending_rate:
                failing = f.pending_fail_share > 0 and self._rng.random() < f.pending_fail_share
                return "pending_failed" if failing else "pending_succeeded"
            return "succeeded"
