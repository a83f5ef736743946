"""/docs and /redoc load nothing from outside the service: their scripts and styles are the app's own."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient
from playwright.sync_api import Route, expect, sync_playwright

from agent.http.server import create_app
from agent.ops.processes import free_port

CHROMIUM = "/usr/bin/chromium"
ASSET = re.compile(r"""<(?:script|link)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""", re.IGNORECASE)
TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


def app_client() -> TestClient:
    """The real app without its lifespan (no database is needed to serve the docs pages)."""
    return TestClient(create_app(), base_url="http://refunds.test")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_pages_load_their_assets_from_the_service_itself(page: str) -> None:
    http = app_client()
    html = http.get(page)
    assert html.status_code == 200, html.text
    assets = ASSET.findall(html.text)
    assert any(a.endswith(".js") for a in assets), assets
    outside = [a for a in assets if re.match(r"(?i)(https?:)?//", a)]
    assert not outside, f"{page} loads {outside} from outside the service"
    for asset in assets:
        served = http.get(asset)
        assert served.status_code == 200, asset
        expected = TYPES[Path(asset).suffix]
        assert expected in served.headers["content-type"], (asset, served.headers["content-type"])
        assert len(served.content) > 1000, asset


def test_root_leads_to_the_console() -> None:
    answer = app_client().get("/", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console"


@pytest.fixture(scope="module")
def served_app() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(), host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_swagger_ui_renders_the_operations_with_no_network_outside(served_app: str) -> None:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (see .ci/run)"
    refused: list[str] = []

    def only_the_service(route: Route) -> None:
        if route.request.url.startswith(served_app):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", only_the_service)
            page.goto(f"{served_app}/docs")
            expect(page.locator(".opblock-summary-path", has_text="/refunds/{refund_id}").first).to_be_visible(
                timeout=30_000
            )
            # The bearer key's scheme gives the page its Authorize button, and the keyed operations their locks.
            expect(page.locator(".btn.authorize").first).to_be_visible()
            expect(page.locator(".opblock .authorization__btn").first).to_be_visible()
            page.goto(f"{served_app}/redoc")
            expect(page.get_by_text("/refunds/{refund_id}").first).to_be_attached(timeout=30_000)
        finally:
            browser.close()
    assert not refused, f"the docs pages asked for {refused}"
