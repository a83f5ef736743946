"""Several real `refund-agent` processes against one test's databases: API, workers, their leases."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOSClient

from agent import runtime
from agent.ops.processes import child_env, free_port, http_ok, spawn, stop, wait_for
from steps.seed import seed
from steps.store import app_db, close_app_database, executor_leases, open_app_database
from tests import web
from tests.conftest import Env

API_TOKEN = "scale-test-token-at-least-32-bytes-long"
#: These clusters send dozens of refunds for one customer to test recovery, not the serial-claimant rule (which
#: would park all but three of them): each refund is judged as the customer's first.
#: Many refunds of one order at once, and of one customer: neither one-open-claim-per-order nor the serial rule.
SERIAL_RULE_OFF = {
    "CUSTOMER_MAX_REFUNDS": "1000000",
    "CUSTOMER_MAX_REFUND_AMOUNT": "100000000",
    "ORDER_MAX_OPEN_CLAIMS": "1000000",
}
DONE = ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")


class Cluster:
    """Processes share the test's databases and sandbox; each gets its own executor id and log."""

    def __init__(self, env: Env, logs: Path, **overrides: str) -> None:
        self.env = env
        self.logs = logs
        self.vars = child_env(
            env.env_vars(REFUND_AGENT_API_TOKEN=API_TOKEN, PYTHONUNBUFFERED="1", **{**SERIAL_RULE_OFF, **overrides}),
            drop=("REFUND_AGENT_CRASH_AT", "REFUND_AGENT_MODEL", "REFUND_AGENT_MODEL_BASE_URL"),
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        settings = env.settings()
        runtime.migrate_databases(settings)
        open_app_database(settings.database.app_database_url)
        seed(app_db().engine)
        self.client: DBOSClient = runtime.client(settings)
        self.api_url: str | None = None

    def start(self, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        env = {**self.vars, "REFUND_AGENT_EXECUTOR_ID": name, **extra}
        proc = spawn(args, env={k: v for k, v in env.items() if v != ""}, log=self.logs / f"{name}.log")
        self.procs[name] = proc
        return proc

    def worker(self, name: str, **extra: str) -> subprocess.Popen[bytes]:
        proc = self.start(name, ["worker"], **extra)
        self.wait_running(name, proc)
        return proc

    def api(self, name: str = "api", **extra: str) -> subprocess.Popen[bytes]:
        port = free_port()
        proc = self.start(name, ["serve", "--no-worker", "--port", str(port)], **extra)
        self.api_url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, self.log(name)
            return http_ok(f"{self.api_url}/healthz")

        wait_for(up, timeout=90, what=f"{name} to answer /healthz")
        return proc

    def wait_running(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """Until the process holds its lease and DBOS launched (the worker prints its banner)."""

        def running() -> bool:
            assert proc.poll() is None, self.log(name)
            return "running refunds" in self.log(name)

        wait_for(running, timeout=90, what=f"{name} to start")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def leases(self) -> dict[str, Any]:
        with app_db().engine.connect() as conn:
            return {row.executor_id: row for row in conn.execute(sa.select(executor_leases))}

    def submit_http(self, refund_id: str, order_id: str, amount: str, currency: str) -> int:
        assert self.api_url is not None
        response = web.post(
            f"{self.api_url}/refunds",
            headers={"Authorization": f"Bearer {API_TOKEN}", "Idempotency-Key": refund_id},
            json={"order_id": order_id, "message": f"Please refund {amount} {currency}.", "amount": amount},
            timeout=30,
        )
        return response.status_code

    def statuses(self, refund_ids: Iterable[str]) -> dict[str, Any]:
        found = self.client.list_workflows(workflow_ids=list(refund_ids), load_input=False, load_output=False)
        return {w.workflow_id: w for w in found}

    def wait_done(self, refund_ids: list[str], timeout: float = 180) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            found = self.statuses(refund_ids)
            return found if len(found) == len(refund_ids) and all(w.status in DONE for w in found.values()) else None

        result: dict[str, Any] = wait_for(done, timeout=timeout, what="every refund to finish", interval=0.25)
        return result

    def close(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.client.destroy()
        close_app_database()

    def dump_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.logs.glob("*.log")))
