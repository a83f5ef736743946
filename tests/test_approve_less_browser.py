"""Approving less than asked in a real browser (Chromium via Playwright): the console's confirmation names both
amounts, Back decides nothing, Confirm pays the approved amount once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dbos import DBOSClient
from playwright.sync_api import Browser, expect

from agent.status import wait_for_outcome
from tests.conftest import Env
from tests.console_server import ConsoleServer, console_server
from tests.test_approve_less import decisions, told
from tests.test_console_browser import ARTIFACTS, browser, sign_in
from tests.test_workflow import parked, submit

__all__ = ["browser"]  # the module's Chromium fixture, shared


@pytest.fixture
def console(env: Env) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env) as running:
        yield running


def test_an_approver_approves_a_lower_amount_through_the_confirmation_and_exactly_that_is_paid(
    env: Env, console: tuple[ConsoleServer, DBOSClient], browser: Browser
) -> None:
    server, client = console
    refund_id = submit(client, "browser-less-01", "ord_1002", "The standing desk arrived scratched.")
    parked(client, refund_id)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    sign_in(page, server, "bob")
    page.goto(f"{server.base_url}/console/refunds/{refund_id}")
    amount = page.locator("#approve-amount")
    expect(amount).to_have_value("4200.00")  # prefilled with the amount asked

    amount.fill("3100")
    page.get_by_role("button", name="Approve").click()
    question = f"Approve 3,100.00 USD for refund {refund_id} instead of the 4,200.00 USD asked?"
    expect(page.locator("#confirm-question")).to_have_text(question)
    page.get_by_role("link", name="Back").click()  # changes nothing
    expect(page).to_have_url(f"{server.base_url}/console/refunds/{refund_id}")
    assert decisions() == [] and env.sandbox.refunds() == []

    page.locator("#approve-amount").fill("3100.00")
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#confirm-question")).to_have_text(question)
    page.screenshot(path=ARTIFACTS / f"approve-less-confirm-{env.backend}.png", full_page=True)
    page.get_by_role("button", name="Confirm").click()
    expect(page).to_have_url(f"{server.base_url}/console/refunds/{refund_id}?done=approve")
    expect(page.locator("#status")).to_have_text("Paid", timeout=60_000)  # the page refreshes until done
    expect(page.locator("#decision")).to_contain_text("approve by operator:bob via console")
    expect(page.locator("#decision")).to_contain_text("3,100.00 USD approved of the 4,200.00 USD asked")
    expect(page.locator("#audit")).to_contain_text("asked_amount: 4200.00")
    context.close()

    outcome = wait_for_outcome(client, refund_id)
    [paid] = env.sandbox.refunds("ch_ord_1002")
    assert paid["amount"] == 310_000 and paid["id"] == outcome["provider_refund_id"]
    assert outcome["amount"] == "3100.00" and decisions() == [("approve", 310_000)]
    assert "3,100.00 USD" in told(refund_id)[0]
