"""The load and the faults of a chaos run: a submitter, an approver and a killer, each on its own thread.

Everything goes through the service's public HTTP API, as clients would: the help desk's client submits,
another client (scope approvals:decide) decides. Calls are retried with the same Idempotency-Key / the same
decision while the server is down, which is the documented contract.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from proving.chaos.cluster import Cluster
from proving.chaos.plan import Plan, PlannedRefund

log = logging.getLogger(__name__)

_RETRYABLE = (httpx.TransportError,)
FINAL = ("completed", "rejected", "failed", "cancelled")


class Driver:
    def __init__(
        self,
        plan: Plan,
        cluster: Cluster,
        *,
        api_token: str,
        approver_key: str,
        deadline: float,
        restart_db: Callable[[], None] | None,
        say: Callable[[str], None],
    ) -> None:
        self.plan, self.cluster, self.deadline, self.restart_db, self.say = plan, cluster, deadline, restart_db, say
        self.auth = {"Authorization": f"Bearer {api_token}"}
        self.approver = {"Authorization": f"Bearer {approver_key}"}
        self.accepted: set[str] = set()
        self.submitted = 0
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._submitting_done = threading.Event()

    # -- plumbing --------------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """One API call, retried through server restarts and 5xx until the fault deadline."""
        delay = 0.2
        while time.monotonic() < self.deadline and not self._stop.is_set():
            try:
                with httpx.Client(base_url=self.cluster.api_url, timeout=30) as http:
                    response = http.request(method, path, **kwargs)
                if response.status_code < 500:
                    return response
                self.counts["api_5xx_retried"] += 1
            except _RETRYABLE:
                self.counts["api_unreachable_retried"] += 1
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        return None

    def _violation(self, text: str) -> None:
        with self._lock:
            self.violations.append(text)
        log.error("chaos violation: %s", text)

    def stop(self) -> None:
        self._stop.set()

    # -- submitter -------------------------------------------------------------------------------
    def _submit(self, p: PlannedRefund) -> int | None:
        body = {
            "order_id": p.order_id,
            "message": p.message,
            "amount": str(p.amount) if p.amount is not None else None,
            "currency": p.currency,
        }
        response = self._call("POST", "/refunds", json=body, headers={**self.auth, "Idempotency-Key": p.refund_id})
        if response is None:
            return None
        if response.status_code in (200, 202) and response.json().get("refund_id") == p.refund_id:
            return response.status_code
        self._violation(f"submission of {p.refund_id} answered {response.status_code}: {response.text[:200]}")
        return None

    def submit_all(self) -> None:
        for p, gap in zip(self.plan.refunds, self.plan.submit_gaps_s, strict=True):
            if self._stop.wait(gap) or time.monotonic() > self.deadline:
                break
            if self._submit(p) is not None:
                with self._lock:
                    self.accepted.add(p.refund_id)
            if p.resubmit and p.refund_id in self.accepted:
                again = self._submit(p)
                self.counts["resubmits"] += 1
                if again is not None and again != 200:
                    self._violation(f"resubmitting {p.refund_id} with the same key answered {again}, not 200")
            with self._lock:
                self.submitted += 1
        self._submitting_done.set()

    # -- approver --------------------------------------------------------------------------------
    def _decide(self, refund_id: str, decision: str, asked: dict[str, str]) -> httpx.Response | None:
        body = {"decision": decision, "amount": asked["amount"], "currency": asked["currency"]}
        return self._call("POST", f"/refunds/{refund_id}/approval", json=body, headers=self.approver)

    def _answer(self, p: PlannedRefund, asked: dict[str, str]) -> None:
        assert p.decision is not None
        if p.second_decision == "same":  # two approvers click at once: one decision, never two resumes
            answers: list[httpx.Response | None] = [None, None]
            barrier = threading.Barrier(2)

            def click(i: int) -> None:
                barrier.wait()
                answers[i] = self._decide(p.refund_id, p.decision or "", asked)

            threads = [threading.Thread(target=click, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.counts["concurrent_double_decisions"] += 1
            firsts = [a.json().get("first") for a in answers if a is not None and a.status_code == 200]
            if firsts.count(True) > 1:
                self._violation(f"{p.refund_id}: two concurrent decisions were both recorded as first")
            return
        first = self._decide(p.refund_id, p.decision, asked)
        if first is None or first.status_code != 200:
            self._violation(
                f"{p.refund_id}: decision {p.decision} answered {first.status_code if first else 'nothing'}"
            )
            return
        if p.second_decision == "opposite":  # a late, contrary click gets the recorded decision back
            other = "reject" if p.decision == "approve" else "approve"
            late = self._decide(p.refund_id, other, asked)
            self.counts["late_contrary_decisions"] += 1
            recorded = late.json().get("recorded", {}) if late is not None else {}
            if late is None or late.status_code != 409 or recorded.get("decision") != p.decision:
                self._violation(f"{p.refund_id}: a late {other} was not refused with the recorded {p.decision}")

    def _parked_now(self) -> set[str]:
        """Refunds the service lists as awaiting approval (one cheap listing instead of a status per refund)."""
        found: set[str] = set()
        cursor: str | None = None
        while True:
            params = {"status": "awaiting_approval", "limit": 100, **({"cursor": cursor} if cursor else {})}
            response = self._call("GET", "/refunds", params=params, headers=self.auth)
            if response is None or response.status_code != 200:
                return found
            page = response.json()
            found |= {item["refund_id"] for item in page["items"]}
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    def _drop_settled(self, waiting: dict[str, PlannedRefund]) -> None:
        """Stop waiting for refunds that ended without ever parking (the judge says whether that was right)."""
        for refund_id in [r for r in waiting if r in self.accepted]:
            response = self._call("GET", f"/refunds/{refund_id}", headers=self.auth)
            if response is not None and response.status_code == 200 and response.json()["status"] in FINAL:
                waiting.pop(refund_id)

    def approve_all(self) -> None:
        waiting = {p.refund_id: p for p in self.plan.refunds if p.decision}
        while waiting and time.monotonic() < self.deadline and not self._stop.is_set():
            parked = self._parked_now() & waiting.keys()
            if not parked and self._submitting_done.is_set():
                self._drop_settled(waiting)
            for refund_id in sorted(parked):
                response = self._call("GET", f"/refunds/{refund_id}", headers=self.approver)
                status = response.json() if response is not None and response.status_code == 200 else {}
                asked = (status.get("approval") or {}).get("request")
                if status.get("status") == "awaiting_approval" and asked:
                    self._answer(waiting.pop(refund_id), asked)
            if self._submitting_done.is_set() and not any(r in self.accepted for r in waiting):
                break
            self._stop.wait(0.5)

    # -- killer ----------------------------------------------------------------------------------
    def _wait_submitted(self, count: int) -> bool:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            if self.submitted >= count or self._submitting_done.is_set():
                return True
            time.sleep(0.05)
        return False

    def kill_all(self) -> None:
        events: list[tuple[int, float, Any]] = [(k.after_submitted, k.delay_s, k) for k in self.plan.kills]
        if self.restart_db is not None and self.plan.pg_restart_after is not None:
            events.append((self.plan.pg_restart_after, 0.0, "pg_restart"))
        for after, delay, event in sorted(events, key=lambda e: (e[0], e[1])):
            if not self._wait_submitted(after) or self._stop.wait(delay):
                return
            if event == "pg_restart":
                assert self.restart_db is not None
                self.restart_db()
                self.counts["postgres_restarts"] += 1
                self.say(f"[{time.monotonic() - self.t0:7.1f}s] restarted Postgres")
                continue
            name = self.cluster.kill(event.target, relaunch_after_s=event.relaunch_after_s, arm=event.arm)
            armed = f", relaunched armed at {event.arm}" if event.arm and name != "serve" else ""
            self.say(f"[{time.monotonic() - self.t0:7.1f}s] SIGKILL {name} after {self.submitted} submitted{armed}")

    def run(self) -> None:
        threads = [
            threading.Thread(target=self.approve_all, name="chaos-approver", daemon=True),
            threading.Thread(target=self.kill_all, name="chaos-killer", daemon=True),
        ]
        for t in threads:
            t.start()
        self.submit_all()
        self.say(f"[{time.monotonic() - self.t0:7.1f}s] submitted {self.submitted}, accepted {len(self.accepted)}")
        for t in threads:
            t.join(max(self.deadline - time.monotonic(), 0) + 5)
