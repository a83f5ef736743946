"""Screenshots of the console for docs/console.md: a refund parked, paid, refused and expired, and the audit log.

Run from the repository with its virtual environment (Chromium at /usr/bin/chromium, nothing downloaded):

    python -m tests.screenshots            # writes docs/console/*.png

It starts the whole service (API, console, worker, payments and evidence sandboxes) on the embedded default
in a fresh data directory with the demo orders, submits refunds through the API, closes one's approval
window through its deadline timer, and photographs the pages at 1400 px wide.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, sync_playwright
from pydantic import SecretStr

from agent import runtime
from agent.approvals import deadline_id
from agent.console.auth import hash_password
from agent.http.server import create_app
from agent.ops.processes import free_port
from agent.settings import Settings
from agent.status import parked, wait_for_outcome
from tests import web
from tests.servers import ThreadedServer, bound_socket

CHROMIUM = "/usr/bin/chromium"
OUT = Path(__file__).parents[1] / "docs" / "console"
WIDTH = 1400
MAX_HEIGHT = 1200  # a long page is cut here (the top of a refund says what it is), and the file stays small
PASSWORD = "screenshot-admin-password"
TOKEN = "screenshot-api-token-at-least-32-bytes"


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"waited {timeout:.0f}s for {what}")


def submit(api: httpx.Client, key: str, order_id: str, message: str) -> str:
    answer = api.post("/refunds", json={"order_id": order_id, "message": message}, headers={"Idempotency-Key": key})
    answer.raise_for_status()
    return str(answer.json()["refund_id"])


def shoot(page: Page, url: str, name: str) -> Path:
    page.goto(url)
    height = min(int(page.evaluate("document.documentElement.scrollHeight")), MAX_HEIGHT)
    path = OUT / f"{name}.png"
    page.screenshot(path=path, clip={"x": 0, "y": 0, "width": WIDTH, "height": height}, full_page=True)
    print(f"{path.relative_to(OUT.parents[1])}: {path.stat().st_size // 1024} KB", flush=True)
    return path


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="refund-console-") as data:
        sock = bound_socket()
        port = int(sock.getsockname()[1])
        settings = Settings(
            refund_agent_data_dir=Path(data),
            refund_agent_port=port,
            payments_sandbox_port=free_port(),
            evidence_sandbox_port=free_port(),
            refund_agent_operators={"lee": f"admin:{hash_password(PASSWORD)}"},
            refund_agent_api_token=SecretStr(TOKEN),
            refund_agent_executor_id="screenshots",
        )
        server = ThreadedServer(create_app(settings, freeze_heap=False), sock=sock)
        server.start()
        client = runtime.client(settings)
        try:
            with web.client(base_url=server.base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
                paid = submit(api, "ticket-4711", "ord_1001", "The wireless mouse stopped working after a week.")
                refused = submit(api, "ticket-4712", "ord_1007", "The bike frame cracked on the first ride.")
                expired = submit(api, "ticket-4713", "ord_1002", "The standing desk arrived with a broken leg.")
                wait_for(lambda: parked(client, expired), "the refund to park")
                client.set_workflow_delay(deadline_id(expired), delay_seconds=0)  # its approval window closes now
                for refund_id in (paid, refused, expired):
                    wait_for_outcome(client, refund_id)
                waiting = submit(api, "ticket-4714", "ord_1002", "The desk's motor hums but the desk won't rise.")
                wait_for(lambda: parked(client, waiting), "the refund to park")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
                page = browser.new_page(viewport={"width": WIDTH, "height": 900})
                page.goto(f"{server.base_url}/console/login")
                page.get_by_label("Name").fill("lee")
                page.get_by_label("Password").fill(PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(f"{server.base_url}/console")
                shoot(page, f"{server.base_url}/console", "list")
                shown = {"parked": waiting, "paid": paid, "refused": refused, "expired": expired}
                for name, refund_id in shown.items():
                    shoot(page, f"{server.base_url}/console/refunds/{refund_id}", name)
                shoot(page, f"{server.base_url}/console/audit", "audit")
                browser.close()
        finally:
            client.destroy()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
