"""The service under test as real processes: the payments and evidence sandboxes, ``serve`` and workers, killed at will.

A killed process is relaunched with the same executor id, so DBOS recovers the workflows it held.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from agent.ops.processes import child_env, free_port, http_ok, spawn, stop, wait_for

log = logging.getLogger(__name__)

_DROP = (
    "REFUND_AGENT_CRASH_AT",
    "SLACK_WEBHOOK_URL",
    "REFUND_AGENT_MODEL",
    "REFUND_AGENT_MODEL_BASE_URL",
    # The evidence look-ups go to the cluster's own evidence sandbox.
    "CARRIER_API_BASE",
    "RETURNS_API_BASE",
    "TICKETS_API_BASE",
)


class Member:
    """One process of the service; ``want_up`` says whether the supervisor should keep it running."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.args, self.env, self.logs = name, args, env, logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.armed: str | None = None
        self.want_up = True
        self.launches = 0

    def launch(self, arm: str | None = None) -> None:
        extra = {"REFUND_AGENT_CRASH_AT": arm} if arm else {}
        self.armed = arm
        self.proc = spawn(self.args, env={**self.env, **extra}, log=self.logs / f"{self.name}.log")
        self.launches += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    def __init__(self, *, env: dict[str, str], workers: int, logs: Path, sandbox_db: str) -> None:
        self.logs = logs
        self.sandbox_port, self.api_port, self.evidence_port = free_port(), free_port(), free_port()
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.evidence_url = f"http://127.0.0.1:{self.evidence_port}"
        ports = {"REFUND_AGENT_PORT": str(self.api_port), "EVIDENCE_SANDBOX_PORT": str(self.evidence_port)}
        base = child_env({**env, "PAYMENTS_API_BASE": self.sandbox_url, **ports}, drop=_DROP)
        self.payments_key = base["PAYMENTS_API_KEY"]
        self.sandbox = Member(
            "sandbox", ["sandbox-payments", "--port", str(self.sandbox_port), "--database-url", sandbox_db], base, logs
        )
        self.evidence = Member("evidence", ["sandbox-evidence", "--port", str(self.evidence_port)], base, logs)
        self.members = [Member("serve", ["serve"], {**base, "REFUND_AGENT_EXECUTOR_ID": "chaos-api"}, logs)]
        for i in range(1, workers + 1):
            self.members.append(
                Member(f"worker-{i}", ["worker"], {**base, "REFUND_AGENT_EXECUTOR_ID": f"chaos-w{i}"}, logs)
            )
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.sandbox.launch()
        wait_for(lambda: http_ok(f"{self.sandbox_url}/_sandbox/healthz"), timeout=60, what="the payments sandbox")
        self.evidence.launch()
        wait_for(lambda: http_ok(f"{self.evidence_url}/_sandbox/healthz"), timeout=60, what="the evidence sandbox")
        for member in self.members:
            member.launch()
        wait_for(lambda: http_ok(f"{self.api_url}/readyz"), timeout=90, what="the refund service")
        self._watch.start()

    def close(self) -> None:
        self._stop.set()
        if self._watch.is_alive():
            self._watch.join(5)
        for member in [*self.members, self.sandbox, self.evidence]:
            member.want_up = False
            if member.proc is not None:
                stop(member.proc)

    def _supervise(self) -> None:
        """Relaunch members that died on their own (a crash point, a lost database): same executor id."""
        while not self._stop.wait(0.2):
            for member in self.members:
                with self._lock:
                    if not member.want_up or member.proc is None or member.alive():
                        continue
                    code = member.proc.returncode
                    armed = member.armed
                    if armed and code == -signal.SIGKILL:
                        self.counts[f"crash_point:{armed}"] += 1
                        self.counts["crash_point_kills"] += 1
                    else:
                        self.counts["unexpected_exits"] += 1
                        log.warning("%s exited with %s; relaunching", member.name, code)
                    member.launch()

    # -- faults ----------------------------------------------------------------------------------
    def kill(self, target: int, *, relaunch_after_s: float, arm: str | None) -> str:
        """SIGKILL one member (no cleanup, no checkpoint), then relaunch it with the same executor id."""
        member = self.members[target % len(self.members)]
        with self._lock:
            member.want_up = False
            was_up = member.alive()
            if member.proc is not None and was_up:
                member.proc.send_signal(signal.SIGKILL)
                member.proc.wait(30)
                self.counts["sigkills"] += 1
            elif member.armed and member.proc is not None and member.proc.returncode == -signal.SIGKILL:
                self.counts["crash_point_kills"] += 1  # it died at its crash point before this kill came
        time.sleep(relaunch_after_s)
        with self._lock:
            member.launch(arm=arm if member.name != "serve" else None)  # serve answers HTTP: never armed
            member.want_up = True
        return member.name

    def disarm_all(self) -> None:
        """Faults stop: relaunch any member still armed with a crash point, unarmed."""
        for member in self.members:
            with self._lock:
                if member.armed and member.alive():
                    assert member.proc is not None
                    member.want_up = False
                    stop(member.proc)
                    member.launch()
                    member.want_up = True
                    self.counts["disarmed"] += 1

    def set_payment_faults(self, **faults: Any) -> None:
        httpx.put(
            f"{self.sandbox_url}/_sandbox/faults", json=faults, headers=self.sandbox_auth(), timeout=10
        ).raise_for_status()

    def add_charges(self, charges: list[dict[str, Any]]) -> None:
        """Tell the sandbox about charges it did not start with (the provider knows what it was paid)."""
        httpx.post(
            f"{self.sandbox_url}/_sandbox/charges", json=charges, headers=self.sandbox_auth(), timeout=60
        ).raise_for_status()

    def send_webhooks(self, secret: str) -> None:
        """Point the sandbox's settlement events at the API, signed with its endpoint secret."""
        target = {"url": f"http://127.0.0.1:{self.api_port}/webhooks/stripe", "secret": secret}
        httpx.put(
            f"{self.sandbox_url}/_sandbox/webhook", json=target, headers=self.sandbox_auth(), timeout=10
        ).raise_for_status()

    def load_evidence(self, seed: dict[str, Any]) -> dict[str, int]:
        """Replace what the evidence sandbox serves (``PUT /_sandbox/data``): the plan's trackers."""
        response = httpx.put(f"{self.evidence_url}/_sandbox/data", json=seed, headers=self.evidence_auth(), timeout=60)
        return dict(response.raise_for_status().json())

    def evidence_stats(self) -> dict[str, int]:
        """Requests each evidence API served (``carrier``: tracking look-ups, repeated ones included)."""
        response = httpx.get(f"{self.evidence_url}/_sandbox/stats", headers=self.evidence_auth(), timeout=10)
        return dict(response.raise_for_status().json())

    def evidence_auth(self) -> dict[str, str]:
        # `sandbox-evidence` as started here has no admin key configured and takes any non-empty one (an empty
        # one is refused): the run's payments key serves, as it does for the payments sandbox.
        return {"Authorization": f"Bearer {self.payments_key}"}

    def sandbox_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.payments_key}"}

    def ledger(self) -> list[dict[str, Any]]:
        """Every refund the provider holds (paged, newest first)."""
        found: list[dict[str, Any]] = []
        after: str | None = None
        with httpx.Client(base_url=self.sandbox_url, headers=self.sandbox_auth(), timeout=30) as http:
            while True:
                params: dict[str, Any] = {"limit": 100, **({"starting_after": after} if after else {})}
                page = http.get("/v1/refunds", params=params).raise_for_status().json()
                found.extend(page["data"])
                if not page["has_more"]:
                    return found
                after = page["data"][-1]["id"]

    def sandbox_stats(self) -> dict[str, int]:
        response = httpx.get(f"{self.sandbox_url}/_sandbox/stats", headers=self.sandbox_auth(), timeout=10)
        return dict(response.raise_for_status().json())
