"""The whole service (API, console, worker) under uvicorn in a thread, with three operators configured."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import httpx
import uvicorn
from dbos import DBOSClient

from agent import runtime
from agent.http.server import UVICORN_PROXY_OPTIONS, create_app
from steps.seed import seed
from steps.store import app_db
from tests import web
from tests.conftest import Env
from tests.servers import ThreadedServer, bound_socket


def quick_hash(password: str) -> str:
    """A console password hash in ``hash_password``'s format at a sixteenth of its scrypt cost (N=2**10: about 3 ms a
    check instead of 50). The console reads the cost from the hash, and the suite signs in hundreds of times."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**10, r=8, p=1, dklen=32)
    return "$".join(
        ["scrypt", "1024", "8", "1", *(base64.urlsafe_b64encode(b).decode().rstrip("=") for b in (salt, digest))]
    )


PASSWORDS = {"ada": "ada-admin-pass", "bob": "bob-approver-pass", "vic": "vic-viewer-pass"}
HASHES = {name: quick_hash(password) for name, password in PASSWORDS.items()}
OPERATORS = {"ada": f"admin:{HASHES['ada']}", "bob": f"approver:{HASHES['bob']}", "vic": f"viewer:{HASHES['vic']}"}
API_TOKEN = "test-api-token-at-least-32-bytes-long"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class ConsoleServer(ThreadedServer):
    def __init__(
        self,
        env: Env,
        *,
        operators: dict[str, str] | None = None,
        reserved: socket.socket | None = None,
        **overrides: Any,
    ) -> None:
        """``reserved``: serve on that held socket's port (one a provider knows and redirects to)."""
        sock = reserved.dup() if reserved else bound_socket()  # a copy of a reserved one: it stays held after a stop
        port = int(sock.getsockname()[1])
        values: dict[str, Any] = {
            "refund_agent_operators": OPERATORS if operators is None else operators,
            "refund_agent_session_secret": "test-session-secret-at-least-32-bytes-long",
            "refund_agent_api_token": API_TOKEN,
            "approval_signing_secret": "test-signing-secret-at-least-32-bytes-long",
            "refund_agent_port": port,
            "queue_worker_concurrency": 8,  # a refund parked for approval holds a worker slot while it waits
        }
        self.settings = env.settings(**{**values, **overrides})
        # As `refund-agent serve` runs it: uvicorn's own X-Forwarded-For handling off.
        config = uvicorn.Config(
            create_app(self.settings, freeze_heap=False), host="127.0.0.1", log_level="warning", **UVICORN_PROXY_OPTIONS
        )
        self.serve_on(config, sock)

    @contextmanager
    def signed_in(self, name: str, password: str | None = None, **headers: str) -> Iterator[httpx.Client]:
        """An HTTP client holding the session cookie of operator ``name``."""
        with web.client(base_url=self.base_url, timeout=30, headers=headers) as http:
            signed_in = sign_in(http, name, PASSWORDS[name] if password is None else password)
            assert signed_in.status_code == 303, signed_in.text
            yield http


def sign_in(http: httpx.Client, name: str, password: str) -> httpx.Response:
    return http.post(
        "/console/login", data={"name": name, "password": password, "csrf": csrf_of(http), "next": "/console"}
    )


def csrf_of(http: httpx.Client, path: str = "/console/login") -> str:
    """The CSRF token the console put in a page's forms for this client's session."""
    page = http.get(path)
    found = _CSRF.search(page.text)
    assert found, f"no CSRF token on {path}: {page.status_code}"
    return found.group(1)


@contextmanager
def console_server(
    env: Env, *, operators: dict[str, str] | None = None, **overrides: Any
) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    """``operators``: instead of ada (admin), bob (approver) and vic (viewer); ``overrides``: other settings."""
    server = ConsoleServer(env, operators=operators, **overrides)
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
    """POST the fields as a browser posts a form (an empty form too: the content type says it is one)."""
    body = urlencode({k: str(v) for k, v in fields.items()})
    return http.post(path, content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
