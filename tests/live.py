"""A real `refund-agent serve` subprocess with secrets chosen per test, for the security and hostile-input suites."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from agent import runtime
from agent.ops.processes import child_env, free_port, http_ok, spawn, stop, wait_for
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database, refunds
from tests import web
from tests.capture import CaptureServer
from tests.conftest import API_KEY, Env
from tests.identities import add_approver_client, approver_env, link_token


@dataclass
class Secrets:
    api_token: str
    """The help desk's key: the service's own token, the ``default`` client (refunds:create, refunds:read)."""
    signing_secret: str
    slack_signing_secret: str
    payments_api_key: str
    approver_key: str
    """The key of ``approvals-desk``, a client with approvals:decide."""

    @classmethod
    def fresh(cls) -> Secrets:
        return cls(
            api_token=f"tok-{secrets.token_urlsafe(24)}",
            signing_secret=f"sig-{secrets.token_urlsafe(24)}",
            slack_signing_secret=f"slk-{secrets.token_hex(16)}",
            payments_api_key=API_KEY,  # the suite's sandbox only accepts this key
            approver_key=f"apr-{secrets.token_urlsafe(24)}",
        )


class LiveService:
    def __init__(
        self, env: Env, logs: Path, slack: CaptureServer, keys: Secrets, overrides: dict[str, str] | None = None
    ) -> None:
        self.env, self.logs, self.keys = env, logs, keys
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.vars = child_env(
            env.env_vars(
                REFUND_AGENT_API_TOKEN=keys.api_token,
                APPROVAL_SIGNING_SECRET=keys.signing_secret,
                SLACK_SIGNING_SECRET=keys.slack_signing_secret,
                SLACK_WEBHOOK_URL=slack.url("webhook"),
                PAYMENTS_API_KEY=keys.payments_api_key,
                REFUND_AGENT_PORT=str(self.port),
                REFUND_AGENT_EXECUTOR_ID="test-live",
                **{**approver_env(), **(overrides or {})},  # an override may replace the operators
            ),
            drop=("REFUND_AGENT_CRASH_AT", "REFUND_AGENT_MODEL", "REFUND_AGENT_MODEL_BASE_URL"),
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = web.client(base_url=self.base, timeout=30)
        self.auth = {"Authorization": f"Bearer {keys.api_token}"}
        self.approver = {"Authorization": f"Bearer {keys.approver_key}"}

    def start(self) -> None:
        self.proc = spawn(["serve"], env=self.vars, log=self.logs / "server.log")
        wait_for(lambda: http_ok(f"{self.base}/readyz"), timeout=90, what="the server to be ready")

    def submit(
        self, key: str, order_id: str, message: str = "It broke, please refund.", **extra: Any
    ) -> httpx.Response:
        body = {"order_id": order_id, "message": message, "amount": None, "currency": None, **extra}
        return self.http.post("/refunds", json=body, headers={**self.auth, "Idempotency-Key": key})

    def status(self, refund_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The refund as a client sees it: the help desk (its requester) unless ``headers`` say another."""
        response = self.http.get(f"/refunds/{refund_id}", headers=headers or self.auth)
        body: dict[str, Any] = response.raise_for_status().json()
        return body

    def until(
        self, refund_id: str, *statuses: str, timeout: float = 90, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(refund_id, headers)
            return status if status["status"] in statuses else None

        return wait_for(check, timeout=timeout, what=f"{refund_id} to reach {statuses}", interval=0.2)

    def decide(self, refund_id: str, decision: str, amount: str, currency: str = "USD") -> httpx.Response:
        """A decision over the API as the approvals desk (the requester's own key is refused)."""
        body = {"decision": decision, "amount": amount, "currency": currency}
        return self.http.post(f"/refunds/{refund_id}/approval", json=body, headers=self.approver)

    def link(self, refund_id: str, operator: str = "dana") -> str:
        """The token of the approval link sent to ``operator`` (from the outbox, where approvers' messages go)."""
        found: str = wait_for(
            lambda: link_token(app_db().engine, refund_id, operator), timeout=10, what=f"{operator}'s link"
        )
        return found

    def refund_rows(self) -> int:
        with app_db().engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(refunds)).scalar_one())

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        self.http.close()


@contextmanager
def live_service(
    env: Env, tmp_path: Path, keys: Secrets | None = None, **overrides: str
) -> Iterator[tuple[LiveService, CaptureServer]]:
    """A `refund-agent serve` with fresh secrets; ``overrides``: more environment variables for it."""
    settings = env.settings()
    runtime.migrate_databases(settings)
    open_app_database(settings.database.app_database_url)
    seed(app_db().engine)
    keys = keys or Secrets.fresh()
    add_approver_client(app_db().engine, keys.approver_key)
    with CaptureServer() as slack:
        service = LiveService(env, tmp_path / "logs", slack, keys, overrides)
        try:
            service.start()
            yield service, slack
        except BaseException:
            print(service.log_text()[-5000:])
            raise
        finally:
            service.close()
            close_app_database()
