"""A real OpenID provider for the console's sign-in tests: the certified ``oidc-provider`` package (npm), run
by ``tests/oidc/provider.mjs`` under node on a free loopback port. Its accounts and their groups are in that
script; its development login page takes any password."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from agent.ops.processes import free_port

HERE = Path(__file__).parent / "oidc"
CLIENT_ID = "refund-console"
CLIENT_SECRET = "refund-console-test-secret"
ROLE_GROUPS = {"refund-admins": "admin", "refund-approvers": "approver", "refund-viewers": "viewer"}
SUBJECTS = {"ada": "ada-sub-001", "bob": "bob-sub-002", "vic": "vic-sub-003", "nina": "nina-sub-004"}


def node() -> str | None:
    return shutil.which("node")


class OidcProvider:
    """``console_url``: the console it knows as its one client (redirect and post-logout URIs)."""

    def __init__(self, console_url: str) -> None:
        self.port = free_port()
        while f":{self.port}" in console_url:  # the console's port is not bound yet: it may come back free
            self.port = free_port()
        self.console_url = console_url
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """The console's settings for signing in through this provider."""
        return {
            "oidc_issuer_url": self.issuer,
            "oidc_client_id": CLIENT_ID,
            "oidc_client_secret": CLIENT_SECRET,
            "oidc_scopes": "openid email groups",
            "oidc_role_groups": ROLE_GROUPS,
            **overrides,
        }

    def start(self, timeout: float = 60) -> None:
        executable = node()
        assert executable is not None
        if not (HERE / "node_modules" / "oidc-provider").exists():  # CI runs `npm ci --prefix tests/oidc` first
            subprocess.run(["npm", "ci", "--prefix", str(HERE), "--no-audit", "--no-fund"], check=True, timeout=300)
        self.process = subprocess.Popen(
            [executable, str(HERE / "provider.mjs"), str(self.port), self.console_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while "ready" not in self.lines:
            assert self.process.poll() is None, f"the OpenID provider exited: {self.lines}"
            assert time.monotonic() < deadline, f"the OpenID provider did not start: {self.lines}"
            time.sleep(0.05)

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
