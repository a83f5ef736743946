"""Fault knobs for the payments sandbox: failures, latency and lost responses, seeded."""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Literal


@dataclasses.dataclass
class Faults:
    """Fault knobs for POST /v1/refunds; held per process (PUT /_sandbox/faults replaces them)."""

    fail_rate: float = 0.0  # probability of a 500 before anything is applied
    latency_ms: int = 0  # sleep before handling each create
    drop_response_rate: float = 0.0  # probability of applying, then answering 500 "response lost"
    fail_next: int = 0  # the next N creates fail (deterministic, checked before the rates)
    drop_next: int = 0  # the next N creates are applied but their response is dropped
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.fail_rate <= 1.0 and 0.0 <= self.drop_response_rate <= 1.0):
            raise ValueError("fault rates must be between 0 and 1")
        if min(self.latency_ms, self.fail_next, self.drop_next) < 0:
            raise ValueError("latency_ms, fail_next and drop_next must not be negative")


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

    def decide(self) -> Literal["fail", "drop"] | None:
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
