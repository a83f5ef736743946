"""The whole service (API, console, worker) under uvicorn in a thread, with two operators configured."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from dbos import DBOSClient

from agent import runtime
from agent.console.auth import hash_password
from agent.http.server import create_app
from agent.ops.processes import free_port
from steps.seed import seed
from steps.store import app_db
from tests.conftest import Env
from tests.servers import ThreadedServer

PASSWORDS = {"ada": "ada-admin-pass", "bob": "bob-approver-pass"}
OPERATORS = {
    "ada": f"admin:{hash_password(PASSWORDS['ada'])}",
    "bob": f"approver:{hash_password(PASSWORDS['bob'])}",
}
API_TOKEN = "test-api-token-at-least-32-bytes-long"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class ConsoleServer(ThreadedServer):
    def __init__(self, env: Env, **overrides: Any) -> None:
        port = free_port()
        self.settings = env.settings(
            **overrides,
            refund_agent_operators=OPERATORS,
            refund_agent_session_secret="test-session-secret-at-least-32-bytes-long",
            refund_agent_api_token=API_TOKEN,
            approval_signing_secret="test-signing-secret-at-least-32-bytes-long",
            refund_agent_port=port,
            queue_worker_concurrency=8,  # a refund parked for approval holds a worker slot while it waits
        )
        super().__init__(create_app(self.settings), port=port)

    @contextmanager
    def signed_in(self, name: str) -> Iterator[httpx.Client]:
        """An HTTP client holding the session cookie of operator ``name``."""
        with httpx.Client(base_url=self.base_url, timeout=30) as http:
            signed_in = http.post(
                "/console/login",
                data={"name": name, "password": PASSWORDS[name], "csrf": csrf_of(http), "next": "/console"},
            )
            assert signed_in.status_code == 303, signed_in.text
            yield http


def csrf_of(http: httpx.Client, path: str = "/console/login") -> str:
    """The CSRF token the console put in a page's forms for this client's session."""
    page = http.get(path)
    found = _CSRF.search(page.text)
    assert found, f"no CSRF token on {path}: {page.status_code}"
    return found.group(1)


@contextmanager
def console_server(env: Env, **overrides: Any) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    """``overrides``: settings on top of the console's own (operators, secrets, port)."""
    server = ConsoleServer(env, **overrides)
    server.start()
    try:
        seed(app_db().engine)  # the Postgres half starts empty; the embedded default seeded itself
        client = runtime.client(server.settings)
        try:
            yield server, client
        finally:
            client.destroy()
    finally:
        server.stop()


def form(http: httpx.Client, path: str, **fields: Any) -> httpx.Response:
    return http.post(path, data={k: str(v) for k, v in fields.items()})
