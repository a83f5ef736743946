"""The console in a real browser: Playwright driving Debian's Chromium (headless), against real workflows.

Screenshots go to ``$REFUND_AGENT_TEST_ARTIFACTS`` (default ``test-artifacts/console``, git-ignored)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from dbos import DBOSClient
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from agent import approvals
from agent.approval_workflows import decide_here
from agent.console.pages import INVISIBLE
from agent.status import wait_for_outcome
from steps.store import app_db, approval_decisions
from tests.conftest import Env
from tests.console_server import PASSWORDS, ConsoleServer, console_server
from tests.identities import DANA
from tests.test_workflow import parked, submit

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(
    os.environ.get("REFUND_AGENT_TEST_ARTIFACTS", Path(__file__).parents[1] / "test-artifacts" / "console")
)
HOSTILE = [  # no digits: the offline model would read one as the amount asked for
    "<script>window.__pwned = 'script'</script> please refund",
    "<img src=x onerror=\"window.__pwned = 'img'\"> it broke",
    "Refund \u202egnp.exe\u202c and \u200f\u0634\u0643\u0631\u0627\u200f",
    "'; DROP TABLE refunds; -- OR ''=''",
    '"><svg onload="window.__pwned = \'svg\'"><a href="javascript:alert(document.cookie)">x</a>',
]


def shown(message: str) -> str:
    """The message as the console shows it: every character, invisible ones spelled out."""
    return INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (see .ci/run)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def sign_in(page: Page, server: ConsoleServer, name: str = "ada") -> None:
    page.goto(f"{server.base_url}/console")
    expect(page).to_have_url(f"{server.base_url}/console/login?next=/console")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{server.base_url}/console")


def test_operator_signs_in_approves_a_pending_refund_and_watches_it_complete(
    env: Env, console: tuple[ConsoleServer, DBOSClient], browser: Browser
) -> None:
    server, client = console
    refund_id = submit(client, "browser-approve-01", "ord_1002", "The standing desk arrived broken.")
    parked(client, refund_id)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    sign_in(page, server)
    card = page.locator(f'section.pending[data-refund="{refund_id}"]')
    expect(card).to_contain_text("4,200.00 USD")
    expect(card).to_contain_text("ord_1002")
    expect(card).to_contain_text("Grace Hopper")
    expect(card).to_contain_text("The standing desk arrived broken.")
    expect(card).to_contain_text("Auto-reject")
    page.screenshot(path=ARTIFACTS / f"pending-{env.backend}.png")

    card.get_by_role("button", name="Approve").click()
    expect(page.locator("#confirm-question")).to_contain_text(f"Approve 4,200.00 USD for refund {refund_id}?")
    page.get_by_role("button", name="Confirm").click()
    expect(page).to_have_url(f"{server.base_url}/console/refunds/{refund_id}?done=approve")
    expect(page.locator("#notice")).to_contain_text("Approved")
    expect(page.locator("#status")).to_have_text("Paid", timeout=60_000)  # the page refreshes until done
    expect(page.locator("#decision")).to_contain_text("approve by operator:ada via console")
    expect(page.locator("#requested-by")).to_contain_text("client:helpdesk")
    expect(page.locator("#idempotency-key")).to_have_text(f"refund:{refund_id}:ord_1002")
    provider_refund = env.sandbox.refunds("ch_ord_1002")
    assert len(provider_refund) == 1
    expect(page.locator("#provider-refund")).to_have_text(provider_refund[0]["id"])
    deciding = page.locator(f'section.execution[data-workflow="{refund_id}"]')
    expect(deciding).to_contain_text("refund_agent__model.request")
    expect(deciding).to_contain_text("refunds.open_approval")
    timeline = page.locator(f'section.execution[data-workflow="{refund_id}/settle"]')
    expect(timeline).to_contain_text("payments.issue_refund")
    assert deciding.locator(".bar").count() + timeline.locator(".bar").count() >= 8
    deadline = page.locator(f'section.execution[data-workflow="{refund_id}/deadline"]')
    expect(deadline).not_to_contain_text("Waiting: due")  # the decision ended the refund's waiting
    expect(page.locator("#chain")).to_contain_text("chain verified")
    expect(page.locator("#audit")).to_contain_text("approval_decided")
    expect(page.locator("#admin-actions a")).to_have_count(0)  # paid: no action its state would refuse
    expect(page.locator("#amount-paid")).to_have_text("4,200.00 USD")  # money one way: as on the list of pending
    expect(page.locator("#asked")).to_contain_text("no amount named")  # the customer named none: the balance
    details = page.locator("#audit").inner_text()
    assert "requested: -" in details and "usage: " in details and "model: offline model; output_tokens: " in details
    assert not any(python in details for python in ("None", "True", "False", "['", "{'"))  # no Python reprs
    expect(page.locator("#not-offered")).to_contain_text("this refund is already paid (provider refund")
    page.screenshot(path=ARTIFACTS / f"refund-{env.backend}.png", full_page=True)
    box = timeline.bounding_box()
    assert box is not None  # the README's picture: the refund at a glance, down to its step timeline
    page.screenshot(
        path=ARTIFACTS / f"console-{env.backend}.png",
        full_page=True,
        clip={"x": 0, "y": 0, "width": 1280, "height": box["y"] + box["height"] + 12},
    )

    page.goto(f"{server.base_url}/console?phase=paid")
    expect(page.locator("#refunds")).to_contain_text(refund_id)
    expect(page.locator("#pending-heading")).to_have_text("Waiting for approval (0)")
    context.close()

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    small = phone.new_page()
    sign_in(small, server, "bob")
    small.goto(f"{server.base_url}/console/refunds/{refund_id}")
    expect(small.locator("#status")).to_have_text("Paid")
    assert small.evaluate("document.documentElement.scrollWidth") <= 390  # nothing runs off a phone screen
    expect(small.get_by_text("Retry the payment")).to_have_count(0)  # approvers see no admin actions
    small.screenshot(path=ARTIFACTS / f"phone-{env.backend}.png", full_page=True)
    phone.close()
    with app_db().engine.connect() as conn:
        assert conn.execute(sa.select(approval_decisions.c.approver)).scalar_one() == "operator:ada"


def test_hostile_customer_messages_render_as_text(
    env: Env, console: tuple[ConsoleServer, DBOSClient], browser: Browser
) -> None:
    server, client = console
    ids = [submit(client, f"browser-hostile-{i:02d}", "ord_1002", message) for i, message in enumerate(HOSTILE)]
    for refund_id in ids:
        parked(client, refund_id)
    context = browser.new_context()
    page = context.new_page()
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    sign_in(page, server)
    for refund_id, message in zip(ids, HOSTILE, strict=True):
        card = page.locator(f'section.pending[data-refund="{refund_id}"]')
        assert card.locator(".message").text_content() == shown(message)
    assert page.locator("script, img, svg, a[href^='javascript']").count() == 0
    assert page.evaluate("window.__pwned") is None
    expect(page.locator(f'section.pending[data-refund="{ids[2]}"] .message')).to_contain_text("Refund [U+202E]gnp.exe")
    page.screenshot(path=ARTIFACTS / f"hostile-{env.backend}.png", full_page=True)
    for refund_id, message in zip(ids, HOSTILE, strict=True):
        page.goto(f"{server.base_url}/console/refunds/{refund_id}")
        assert page.locator("#customer-message").text_content() == shown(message)
        assert page.locator('meta[http-equiv="refresh"]').count() == 0  # no reload under an approver's eyes
        assert page.locator("script, img, svg, a[href^='javascript']").count() == 0
        assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    context.close()
    for refund_id in ids:  # a rejection ends each one; the customer is told in plain text too
        approvals.decide_pending(decide_here, refund_id=refund_id, decision="reject", approver=DANA, via="console")
    for refund_id in ids:
        assert wait_for_outcome(client, refund_id)["status"] == "rejected"


def test_an_admin_revokes_another_operators_session_from_the_sessions_page(
    env: Env, console: tuple[ConsoleServer, DBOSClient], browser: Browser
) -> None:
    server, _ = console
    ada_context, bob_context = browser.new_context(), browser.new_context()
    ada, bob = ada_context.new_page(), bob_context.new_page()
    sign_in(ada, server)
    sign_in(bob, server, "bob")
    expect(bob.locator("#sessions-link")).to_have_count(0)  # approvers do not manage sessions
    ada.locator("#sessions-link").click()
    expect(ada).to_have_url(f"{server.base_url}/console/sessions")
    expect(ada.locator("#this-session")).to_have_count(1)
    bob_row = ada.locator('tr[data-operator="bob"]')
    expect(bob_row).to_contain_text("127.0.0.1")
    expect(bob_row).to_contain_text("Chrome")  # the browser's user agent
    bob_row.get_by_role("link", name="Revoke…").click()
    expect(ada.locator("h1")).to_contain_text("of bob")
    ada.get_by_role("button", name="Yes, revoke").click()
    expect(ada.locator("#notice")).to_contain_text("Session revoked")
    expect(ada.locator('tr[data-operator="bob"]')).to_have_count(0)
    ada.screenshot(path=ARTIFACTS / f"sessions-{env.backend}.png", full_page=True)
    bob.reload()
    expect(bob).to_have_url(f"{server.base_url}/console/login?next=/console")  # bob's session is over
    ada.get_by_role("button", name="Sign out").click()
    expect(ada).to_have_url(f"{server.base_url}/console/login")
    ada.goto(f"{server.base_url}/console/sessions")
    expect(ada).to_have_url(f"{server.base_url}/console/login?next=/console/sessions")
    ada_context.close()
    bob_context.close()
