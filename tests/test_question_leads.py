"""A refund waiting for its customer, as a support lead sees and moves it: the console and the API show what was
asked, by when, what the customer answered and what it added; a lead (the approver role) sends the refund to a person
or ends the wait, once, and an answer that comes after is refused.

The whole service runs in this process (uvicorn in a thread, tests/console_server.py) against this module's own
carrier, returns and help-desk sandbox, on both databases.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from dbos import DBOSClient
from markupsafe import escape

from agent import replies
from agent.ops.processes import wait_for
from agent.questions import ENDED_DETAIL, expiry_id, reminder_id
from steps import audit, clients
from steps.records import AuditEntry
from steps.store import app_db
from tests import web
from tests.conftest import Env
from tests.console_server import API_TOKEN, ConsoleServer, console_server, csrf_of, form
from tests.evidence_server import EvidenceServer, demo_seed
from tests.test_customer_questions import PNG, link_in, message

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[EvidenceServer]:
    server = EvidenceServer(demo_seed())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def console(env: Env, sandbox: EvidenceServer) -> Iterator[tuple[ConsoleServer, DBOSClient]]:
    with console_server(env, **sandbox.settings()) as running:
        yield running


def submit(server: ConsoleServer, key: str, order_id: str, words: str) -> str:
    with web.client(base_url=server.base_url, timeout=30) as http:
        answer = http.post(
            "/refunds", json={"order_id": order_id, "message": words}, headers={**AUTH, "Idempotency-Key": key}
        )
    assert answer.status_code == 202, answer.text
    return key


def status(server: ConsoleServer, refund_id: str) -> dict[str, Any]:
    with web.client(base_url=server.base_url, timeout=30) as http:
        found: dict[str, Any] = http.get(f"/refunds/{refund_id}", headers=AUTH).raise_for_status().json()
    return found


def reaches(server: ConsoleServer, refund_id: str, wanted: str) -> dict[str, Any]:
    def there() -> dict[str, Any] | None:
        found = status(server, refund_id)
        return found if found["status"] == wanted else None

    return wait_for(there, timeout=60, what=f"refund {refund_id} {wanted}", interval=0.2)


def conversation(server: ConsoleServer, refund_id: str) -> dict[str, Any]:
    with web.client(base_url=server.base_url, timeout=30) as http:
        found: dict[str, Any] = http.get(f"/refunds/{refund_id}/conversation", headers=AUTH).raise_for_status().json()
    return found


def waiting(server: ConsoleServer, refund_id: str) -> str:
    """The refund asks its customer: the answer link they were sent."""
    reaches(server, refund_id, "awaiting_customer")
    return link_in(wait_for(lambda: message(refund_id, "question"), timeout=30, what="the question sent"))


def events(refund_id: str) -> list[AuditEntry]:
    with app_db().engine.connect() as conn:
        return audit.entries(conn, refund_id)


def test_a_lead_sends_a_waiting_refund_to_a_person_who_reads_why_and_a_later_answer_is_refused(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    refund_id = submit(server, "lead-person-01", "ord_1001", "My parcel never arrived.")
    path = waiting(server, refund_id)
    with server.signed_in("vic") as vic:  # a viewer reads the wait and may not move it
        page = vic.get(f"/console/refunds/{refund_id}").text
        assert 'id="question"' in page and "Waiting for the customer" in page and 'id="wait-actions"' not in page
        refused = form(vic, f"/console/refunds/{refund_id}/wait", move="person", csrf=csrf_of(vic, "/console"))
        assert refused.status_code == 403
    with server.signed_in("bob") as bob:
        page = bob.get(f"/console/refunds/{refund_id}").text
        assert 'id="wait-actions"' in page and "to confirm the parcel shown delivered never came" in page
        token = csrf_of(bob, f"/console/refunds/{refund_id}")
        moved = form(bob, f"/console/refunds/{refund_id}/wait", move="person", csrf=token)
        assert moved.status_code == 303, moved.text
        again = form(bob, f"/console/refunds/{refund_id}/wait", move="end", csrf=token)
        assert again.status_code == 409 and "sent to a person by a support lead" in again.text
    timers = (reminder_id(refund_id), expiry_id(refund_id))

    def settled() -> dict[str, Any] | None:  # parked, the customer told, nothing left to fall due
        found = reaches(server, refund_id, "awaiting_approval")
        runs = {w["workflow_id"]: w["status"] for w in found["workflows"]}
        told = (found["customer_message"] or {}).get("about") == "waiting"
        return found if told and all(runs.get(t) != "DELAYED" for t in timers) else None

    parked = wait_for(settled, timeout=60, what="the refund parked with its timers ended")
    with web.client(base_url=server.base_url, timeout=30) as http:
        late = http.post(path, data={"received": "no"})
    assert late.status_code == 409 and "support team" in late.text
    assert (
        "support lead operator:bob sent it to a person before the customer answered"
        in (parked["approval"]["request"]["reason"])
    )
    assert parked["question"]["state"] == "to_person" and parked["customer_message"]["about"] == "waiting"
    assert [e.payload["operator"] for e in events(refund_id) if e.event == "customer_wait_to_person"] == [
        "operator:bob"
    ]
    assert conversation(server, refund_id)["question"]["state"] == "to_person"
    assert env.sandbox.refunds("ch_ord_1001") == []


def test_a_lead_ends_a_wait_and_the_refund_closes_unpaid_with_the_customer_told_once(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    refund_id = submit(server, "lead-end-0001", "ord_1001", "My parcel never arrived.")
    waiting(server, refund_id)
    with server.signed_in("bob") as bob:
        token = csrf_of(bob, f"/console/refunds/{refund_id}")
        wrong = form(bob, f"/console/refunds/{refund_id}/wait", move="refund-it", csrf=token)
        nothing = form(bob, "/console/refunds/no-such-refund/wait", move="end", csrf=token)
        ended = form(bob, f"/console/refunds/{refund_id}/wait", move="end", csrf=token)
        assert (wrong.status_code, nothing.status_code, ended.status_code) == (400, 404, 303), ended.text
        shown = bob.get(f"/console/refunds/{refund_id}?done=wait-ended").text
    closed = reaches(server, refund_id, "rejected")
    assert "The wait was ended" in shown and 'id="wait-actions"' not in shown
    assert closed["question"]["state"] == "ended"
    [rejected] = [e.payload for e in events(refund_id) if e.event == "refund_rejected"]
    assert rejected["detail"] == ENDED_DETAIL.format(operator="operator:bob")
    assert message(refund_id, "outcome") == replies.wait_ended("delivery")
    assert [e.event for e in events(refund_id)].count("customer_wait_ended") == 1
    assert env.sandbox.refunds("ch_ord_1001") == []


def test_the_conversation_shows_the_question_the_answer_and_what_it_added_escaped(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    refund_id = submit(server, "lead-talk-0001", "ord_1010", "The book bundle arrived broken.")
    path = waiting(server, refund_id)
    words = "Here it is <img src=x onerror=alert('x')>"
    with web.client(base_url=server.base_url, timeout=30) as http:
        taken = http.post(path, files={"file": ("books.png", PNG, "image/png")}, data={"text": words})
    assert taken.status_code == 202, taken.text

    def parked() -> dict[str, Any] | None:  # a photo against a parcel still moving: a person; the customer told
        found = reaches(server, refund_id, "awaiting_approval")
        return found if (found["customer_message"] or {}).get("about") == "waiting" else None

    wait_for(parked, timeout=60, what="the refund parked with the customer told")
    talk = conversation(server, refund_id)
    assert talk["question"]["kind"] == "photo" and talk["question"]["state"] == "answered"
    turns = [(t["speaker"], t["channel"], t["about"]) for t in talk["turns"]]
    assert turns[:2] == [("customer", "api", "request"), ("agent", "email", "question")]
    assert ("customer", "link", "answer") in turns and turns[-1] == ("agent", "email", "waiting")
    [answer] = [t for t in talk["turns"] if t["about"] == "answer"]
    assert answer["text"] == words and answer["delivery"] is None
    assert any(d.startswith(f"image 'books.png': image/png, {len(PNG)} bytes (kept, sha256") for d in answer["details"])
    with server.signed_in("bob") as bob:  # the answer came first: a lead's move does nothing
        late = form(bob, f"/console/refunds/{refund_id}/wait", move="end", csrf=csrf_of(bob, "/console"))
    assert late.status_code == 409 and "answered by the customer" in late.text
    assert status(server, refund_id)["status"] == "awaiting_approval"
    with server.signed_in("vic") as vic:
        page = vic.get(f"/console/refunds/{refund_id}").text
    shown = page[page.index('id="conversation"') : page.index('id="deliveries"')]
    assert str(escape(words)) in shown and "<img src=x" not in page
    assert "their answer" in shown and "a photo of the item" in shown and "answered at" in shown


def test_an_approvals_client_moves_a_wait_over_the_api_and_the_requester_may_not(
    env: Env, console: tuple[ConsoleServer, DBOSClient]
) -> None:
    server, _ = console
    key = "lead-api-approver-key-0123456789abcdef"
    clients.add_client(app_db().engine, name="lead-desk", scopes=["approvals:decide"], key=key)
    lead = {"Authorization": f"Bearer {key}"}
    refund_id = submit(server, "lead-api-0001", "ord_1001", "My parcel never arrived.")
    waiting(server, refund_id)
    path = f"/refunds/{refund_id}/question"
    with web.client(base_url=server.base_url, timeout=30) as http:
        own = http.post(path, json={"move": "end"}, headers=AUTH)  # the requester's key: never its own judge
        odd = http.post(path, json={"move": "pay"}, headers=lead)
        extra = http.post(path, json={"move": "end", "operator": "operator:ada"}, headers=lead)
        unknown = http.post("/refunds/no-such-refund/question", json={"move": "end"}, headers=lead)
        assert (own.status_code, odd.status_code, extra.status_code, unknown.status_code) == (403, 422, 422, 404)
        assert status(server, refund_id)["question"]["state"] == "open"
        moved = http.post(path, json={"move": "person"}, headers=lead)
        again = http.post(path, json={"move": "end"}, headers=lead)
    assert moved.status_code == 200, moved.text
    assert moved.json() == {
        "refund_id": refund_id,
        "move": "person",
        "question_state": "to_person",
        "by": "client:lead-desk",
    }
    assert again.status_code == 409 and again.json()["state"] == "to_person"
    parked = reaches(server, refund_id, "awaiting_approval")
    assert "support lead client:lead-desk sent it to a person" in parked["approval"]["request"]["reason"]
    scraped = web.get(f"{server.base_url}/metrics").text
    moved_away = re.search(r'^refund_agent_customer_questions\{state="to_person"\} (\d+)', scraped, re.M)
    assert moved_away is not None and int(moved_away.group(1)) >= 1, scraped
    assert re.search(r"^refund_agent_customer_questions_overdue \d+", scraped, re.M)
