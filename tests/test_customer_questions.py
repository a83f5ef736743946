"""Asking the customer, through HTTP, on both databases: the refund waits as rows for what only the customer can give,
tells them exactly what and by when, takes one answer (the signed link or a comment on its help-desk ticket), judges
the refund again with it and parks it for a person (who reads the answer; once approved it pays once) or refuses; a
reminder, an expiry that closes it, and every wrong answer (a second one, a late one, a duplicate webhook, another
refund's link) handled once or refused.

The service runs in this process (the app's lifespan launches DBOS against the test's databases); the evidence and
help-desk sandbox is this module's own, with tickets 601-620 of Ada's. Timers are made due with
``DBOS.set_workflow_delay`` instead of waiting days for them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOS
from fastapi.testclient import TestClient

from agent import replies, tokens
from agent.http.server import create_app
from agent.http.zendesk import COMMENT_ADDED, SIGNATURE_HEADER, TICKET_CREATED, TIMESTAMP_HEADER, sign
from agent.ops.processes import wait_for
from agent.questions import EXPIRED_DETAIL, MAX_FILE_BYTES, expiry_id, reminder_id
from agent.settings import Settings
from sandbox.evidence import CommentSeed, EvidenceSeed, TicketSeed, ago
from steps import clients, helpdesk
from steps.evidence import QuestionKind
from steps.seed import seed
from steps.store import app_db, customer_answer_files, outbox
from tests import web
from tests.conftest import Env
from tests.evidence_server import CREDENTIALS, EvidenceServer, demo_seed

SECRET = "zendesk-webhook-signing-secret-0123456789"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 64


@pytest.fixture(scope="module")
def desk() -> Iterator[EvidenceServer]:
    """The carrier, returns and help desk of the demo, with tickets 601-620 of Ada's (comments are posted there)."""
    opened = [CommentSeed(role="end-user", author_name="Ada", body="Where is my parcel?", at=ago(0))]
    tickets = [
        TicketSeed(
            id=n, requester_email="ada@example.com", requester_name="Ada", subject="Refund", status="open",
            created=ago(0), comments=opened,
        )
        for n in range(601, 621)
    ]  # fmt: skip
    seed = demo_seed()
    server = EvidenceServer(EvidenceSeed(trackers=seed.trackers, returns=seed.returns, tickets=tickets))
    try:
        yield server
    finally:
        server.stop()


READER_KEY = "question-reader-key-0123456789abcdefghij"


class Service:
    def __init__(self, http: TestClient, settings: Settings) -> None:
        self.http, self.settings = http, settings
        self.auth = {"Authorization": f"Bearer {settings.api_token()}"}
        self.reader = {"Authorization": f"Bearer {READER_KEY}"}  # reads every refund (a help desk's too)

    def submit(self, key: str, order_id: str, message: str) -> str:
        body = {"order_id": order_id, "message": message}
        answer = self.http.post("/refunds", json=body, headers={**self.auth, "Idempotency-Key": key})
        assert answer.status_code == 202, answer.text
        return key

    def status(self, refund_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/refunds/{refund_id}", headers=self.reader)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def reaches(self, refund_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
        def there() -> dict[str, Any] | None:
            found = self.status(refund_id)
            # An ended refund's row changes in the step that ends it; its outcome is its workflow's result, a moment on.
            ended = status not in ("completed", "rejected") or found["outcome"] is not None
            return found if found["status"] == status and ended else None

        return wait_for(there, timeout=timeout, what=f"refund {refund_id} {status}")

    def approve(self, refund_id: str, currency: str = "USD") -> dict[str, Any]:
        """A person approves the parked refund: the reader client (admin: it may decide; it did not ask)."""
        body = {"decision": "approve", "currency": currency}
        decided = self.http.post(f"/refunds/{refund_id}/approval", json=body, headers=self.reader)
        assert decided.status_code == 200, decided.text
        return self.reaches(refund_id, "completed")

    def deliver(self, payload: dict[str, Any]) -> Any:  # the test client's response (httpx2's, under Starlette 1)
        body = json.dumps(payload).encode()
        when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        headers = {SIGNATURE_HEADER: sign(SECRET, when, body), TIMESTAMP_HEADER: when}
        return self.http.post(
            "/webhooks/helpdesk", content=body, headers={**headers, "Content-Type": "application/json"}
        )


@contextmanager
def serving(env: Env, desk: EvidenceServer, **overrides: Any) -> Iterator[Service]:
    settings = env.settings(
        helpdesk_webhook_secret=SECRET, email_poll_interval_seconds=0.1, **desk.settings(), **overrides
    )
    with TestClient(create_app(settings, freeze_heap=False)) as http:
        seed(app_db().engine)  # the demo's orders (the service seeds them itself only on its embedded database)
        clients.add_client(app_db().engine, name="question-reader", scopes=["admin"], key=READER_KEY)
        yield Service(http, settings)


def message(refund_id: str, about: str) -> str | None:
    key = f"{refund_id}:customer" if about == "outcome" else f"{refund_id}:customer:{about}"
    with app_db().engine.connect() as conn:
        return conn.execute(sa.select(outbox.c.body).where(outbox.c.message_key == key)).scalar_one_or_none()


def link_in(text: str) -> str:
    """The answer link's path, as the customer's message gives it."""
    found = re.search(r"https?://[^/\s]+(/answer/[^/\s]+/[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+)", text)
    assert found is not None, text
    return found.group(1)


def asked(svc: Service, refund_id: str, kind: QuestionKind) -> str:
    """Wait for the refund to ask ``kind``; the link the customer was sent."""
    view = svc.reaches(refund_id, "awaiting_customer")
    assert view["question"]["kind"] == kind and view["question"]["state"] == "open"
    text = wait_for(lambda: message(refund_id, "question"), timeout=30, what="the question sent")
    assert replies.NEEDED[kind] in text and "We need your answer by" in text  # what exactly, and by when
    return link_in(text)


def paid(env: Env, order_id: str) -> list[dict[str, Any]]:
    return env.sandbox.refunds(f"ch_{order_id}")


def test_a_parcel_shown_delivered_asks_the_customer_waits_as_rows_and_their_answer_goes_to_a_person_who_pays_once(
    env: Env, desk: EvidenceServer
) -> None:
    with serving(env, desk) as svc:
        refund_id = svc.submit("ask-link-0001", "ord_1001", "My parcel never arrived.")
        path = asked(svc, refund_id, "delivery")
        resting = {refund_id: "SUCCESS", reminder_id(refund_id): "DELAYED", expiry_id(refund_id): "DELAYED"}

        def at_rest() -> dict[str, Any] | None:  # the deciding run ends a moment after its last step, the question
            found = svc.status(refund_id)
            return found if {w["workflow_id"]: w["status"] for w in found["workflows"]} == resting else None

        # Nothing resident while it waits: the deciding run ended; the reminder and the deadline are DELAYED rows.
        view = wait_for(at_rest, timeout=30, what="the deciding run to end, leaving two DELAYED timers")
        question = view["question"]
        assert question["asked_at"] < question["remind_at"] < question["expires_at"]
        assert view["customer_message"]["about"] == "question"
        # Due at the deadline: its delay is counted from the recorded question, so it falls due a moment after it.
        due = datetime.fromisoformat(question["deadline"]["due_at"]) - datetime.fromisoformat(question["expires_at"])
        assert question["deadline"]["status"] == "DELAYED" and 0 <= due.total_seconds() < 5

        page = svc.http.get(path)
        assert page.status_code == 200 and "I still have not received it" in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        answer = svc.http.post(path, data={"received": "no", "text": "Still <b>nothing</b> here."})
        assert answer.status_code == 202, answer.text
        again = svc.http.post(path, data={"received": "no", "text": "Still <b>nothing</b> here."})  # a double click
        assert again.status_code == 202, again.text
        parked = svc.reaches(refund_id, "awaiting_approval")  # their word against the carrier's photo: a person
        told = wait_for(lambda: message(refund_id, "waiting"), timeout=30, what="the customer told a person looks")
        other = svc.http.post(path, data={"received": "yes"})  # a second, different answer
        assert other.status_code == 409 and "answered already" in other.text
        assert paid(env, "ord_1001") == []
        done = svc.approve(refund_id)

    assert [r["metadata"]["idempotency_key"] for r in paid(env, "ord_1001")] == [f"refund:{refund_id}:ord_1001"]
    reason = parked["approval"]["request"]["reason"]
    assert "the customer confirmed the parcel never reached them, against the carrier's photo at the door" in reason
    assert told.startswith("Thank you for your answer. A member of our team now reviews your request")
    assert done["question"]["state"] == "answered" and done["question"]["answered_via"] == "link"
    assert done["customer_message"]["about"] == "outcome" and "42.00 USD" in done["customer_message"]["text"]


def test_asking_off_keeps_the_old_path(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk, customer_questions="") as svc:
        refund_id = svc.submit("ask-off-00001", "ord_1001", "My parcel never arrived.")
        view = svc.reaches(refund_id, "awaiting_approval")
        assert view["question"] is None and message(refund_id, "question") is None


def ticket_created(ticket: int, order: str, description: str) -> dict[str, Any]:
    detail = {"id": str(ticket), "description": description, "tags": [], "subject": "Refund", "external_id": order}
    return {"type": TICKET_CREATED, "id": f"ev-{ticket}", "subject": f"zen:ticket:{ticket}", "detail": detail}


def comment_added(
    ticket: int, comment: int, body: str, attachments: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    said = {"id": str(comment), "body": body, "is_public": True, "author": {"id": "77", "is_staff": False},
            "attachments": attachments or []}  # fmt: skip
    return {
        "type": COMMENT_ADDED, "id": f"ev-{ticket}-{comment}", "time": datetime.now(UTC).isoformat(),
        "subject": f"zen:ticket:{ticket}", "detail": {"id": str(ticket)}, "event": {"comment": said},
    }  # fmt: skip


def on_ticket(desk: EvidenceServer, ticket: int, message_key: str) -> list[dict[str, Any]]:
    auth = (f"{CREDENTIALS.tickets_email}/token", str(CREDENTIALS.tickets_token))
    found = web.get(f"{desk.base_url}/api/v2/tickets/{ticket}/comments.json", auth=auth).raise_for_status().json()
    return [c for c in found["comments"] if helpdesk.marker(message_key) in c["body"]]


def test_a_ticket_asks_on_the_ticket_and_the_customers_one_comment_goes_to_a_person_who_pays_once(
    env: Env, desk: EvidenceServer
) -> None:
    ticket = 601 if env.backend == "sqlite" else 602
    with serving(env, desk) as svc:
        started = svc.deliver(ticket_created(ticket, "ord_1010", "The book bundle arrived broken."))
        refund_id = started.json()["refund_id"]
        asked(svc, refund_id, "photo")
        wait_for(lambda: on_ticket(desk, ticket, f"{refund_id}:customer:question"), timeout=30, what="the question")
        photo = {"file_name": "books.jpg", "content_type": "image/jpeg", "size": 48213,
                 "content_url": "https://desk.example/attachments/1/books.jpg"}  # fmt: skip
        first = svc.deliver(comment_added(ticket, 9901, "Here is the photo.", [photo]))
        assert (first.status_code, first.json()["outcome"]) == (200, "answer_recorded"), first.text
        repeat = svc.deliver(comment_added(ticket, 9901, "Here is the photo.", [photo]))  # Zendesk's retry, signed anew
        assert repeat.json()["outcome"] == "answer_recorded" and repeat.json()["answer_status"] == 202
        parked = svc.reaches(refund_id, "awaiting_approval")  # a photo against a parcel still moving: a person
        second = svc.deliver(comment_added(ticket, 9902, "And another thing."))
        assert (second.json()["outcome"], second.json()["answer_status"]) == ("answer_refused", 409)
        wait_for(lambda: on_ticket(desk, ticket, f"{refund_id}:customer:waiting"), timeout=30, what="the wait")
        assert paid(env, "ord_1010") == []
        done = svc.approve(refund_id, "GBP")
        outcome = f"{refund_id}:customer"
        wait_for(lambda: on_ticket(desk, ticket, outcome), timeout=30, what="the outcome on the ticket")
    assert len(paid(env, "ord_1010")) == 1
    assert "1 photo(s) of the item (image/jpeg, 48213 bytes)" in parked["approval"]["request"]["reason"]
    assert done["question"]["answered_via"] == "helpdesk:9901"
    assert done["question"]["files"] == [{"content_type": "image/jpeg", "size": 48213, "sha256": ""}]
    assert len(on_ticket(desk, ticket, f"{refund_id}:customer:question")) == 1


def test_a_reminder_then_an_expiry_closes_it_and_a_late_answer_is_refused(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk) as svc:
        refund_id = svc.submit("ask-expire-01", "ord_1001", "My parcel never arrived.")
        path = asked(svc, refund_id, "delivery")
        DBOS.set_workflow_delay(reminder_id(refund_id), delay_seconds=0)
        reminder = wait_for(lambda: message(refund_id, "reminder"), timeout=30, what="the reminder")
        assert reminder.startswith("A reminder") and link_in(reminder) == path
        DBOS.set_workflow_delay(expiry_id(refund_id), delay_seconds=0)
        closed = svc.reaches(refund_id, "rejected")
        late = svc.http.post(path, data={"received": "no"})
        page = svc.http.get(path)
    assert closed["outcome"]["detail"] == EXPIRED_DETAIL and closed["question"]["state"] == "expired"
    assert closed["customer_message"]["text"] == replies.unanswered("delivery")
    assert late.status_code == 410 and "time to answer has passed" in late.text
    assert page.status_code == 410
    assert paid(env, "ord_1001") == []


def _ended(workflow_id: str) -> bool:
    found = DBOS.get_workflow_status(workflow_id)
    return found is not None and found.status == "SUCCESS"


def test_an_answer_that_won_leaves_the_deadline_nothing_to_do(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk) as svc:
        refund_id = svc.submit("ask-race-0001", "ord_1001", "My parcel never arrived.")
        path = asked(svc, refund_id, "delivery")
        assert svc.http.post(path, data={"received": "yes"}).status_code == 202  # it turned up after all
        done = svc.reaches(refund_id, "rejected")
        # Answered: the deadline was made due at once, ran, found the answer and ended with nothing to do.
        expiry = wait_for(lambda: DBOS.get_workflow_status(expiry_id(refund_id)), timeout=30, what="the deadline")
        ended = wait_for(lambda: _ended(expiry.workflow_id), timeout=30, what="the deadline ended")
        assert ended and DBOS.retrieve_workflow(expiry_id(refund_id)).get_result() is None
    assert done["outcome"]["detail"].startswith("refuse: the customer said the parcel arrived after all")
    assert done["customer_message"]["text"].startswith("Thank you for letting us know your parcel arrived")
    assert paid(env, "ord_1001") == []


def test_a_link_answers_its_own_refunds_question_only_and_never_approves(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk) as svc:
        mine = svc.submit("ask-link-mine", "ord_1001", "My parcel never arrived.")
        path = asked(svc, mine, "delivery")
        token = path.rsplit("/", 1)[1]
        other = svc.http.post(f"/answer/someone-elses-refund/{token}", data={"received": "no"})
        forged = svc.http.post(f"/answer/{mine}/{token[:-4]}AAAA", data={"received": "no"})
        approval = tokens.sign(
            tokens.ApprovalClaims(mine, Decimal("42.00"), "USD", datetime(2099, 1, 1, tzinfo=UTC), "operator:dana"),
            svc.settings.signing_secret(),
        )  # fmt: skip
        as_answer = svc.http.post(f"/answer/{mine}/{approval}", data={"received": "no"})
        as_approval = svc.http.get(f"/approve/{token}")
        assert svc.status(mine)["question"]["state"] == "open"
    assert other.status_code == 404 and "does not answer refund someone-elses-refund" in other.text
    assert (forged.status_code, as_answer.status_code, as_approval.status_code) == (401, 401, 401)


def test_an_uploaded_photo_is_kept_as_an_image_and_anything_else_is_refused(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk) as svc:
        refund_id = svc.submit("ask-photo-001", "ord_1010", "The book bundle arrived broken.")
        path = asked(svc, refund_id, "photo")
        script = b"<html><script>alert(document.cookie)</script></html>"
        html = svc.http.post(path, files={"file": ("books.jpg", script, "image/jpeg")})
        huge = svc.http.post(path, files={"file": ("books.png", PNG + b"\x00" * MAX_FILE_BYTES, "image/png")})
        assert (html.status_code, huge.status_code) == (415, 413)
        elsewhere = svc.http.post("/refunds", files={"file": ("books.png", PNG, "image/png")}, headers=svc.auth)
        assert elsewhere.status_code == 415 and "no endpoint here takes multipart" in elsewhere.text  # unread
        assert svc.status(refund_id)["question"]["state"] == "open"
        taken = svc.http.post(path, files={"file": ("books.png", PNG, "application/octet-stream")}, data={"text": "x"})
        assert taken.status_code == 202, taken.text
        parked = svc.reaches(refund_id, "awaiting_approval")
        assert paid(env, "ord_1010") == []
        done = svc.approve(refund_id, "GBP")
        with app_db().engine.connect() as conn:
            kept = conn.execute(
                sa.select(customer_answer_files).where(customer_answer_files.c.refund_id == refund_id)
            ).all()
    assert [(r.content_type, r.size, r.sha256, r.content) for r in kept] == [
        ("image/png", len(PNG), hashlib.sha256(PNG).hexdigest(), PNG)
    ]
    assert done["question"]["files"] == [{"content_type": "image/png", "size": len(PNG), "sha256": kept[0].sha256}]
    assert f"1 photo(s) of the item (image/png, {len(PNG)} bytes)" in parked["approval"]["request"]["reason"]
    assert len(paid(env, "ord_1010")) == 1


def test_a_return_tracking_number_sends_the_refund_to_a_person_who_reads_it(env: Env, desk: EvidenceServer) -> None:
    with serving(env, desk) as svc:
        refund_id = svc.submit("ask-return-01", "ord_1015", "I returned the yoga mat weeks ago.")
        path = asked(svc, refund_id, "return_tracking")
        answer = svc.http.post(path, data={"tracking_number": "1Z999AA10123456784"})
        assert answer.status_code == 202, answer.text
        svc.reaches(refund_id, "awaiting_approval")
        wait_for(lambda: message(refund_id, "waiting"), timeout=30, what="the customer told a person looks")
        view = svc.status(refund_id)
    assert "1Z999AA10123456784" in view["approval"]["request"]["reason"]
    assert view["customer_message"]["about"] == "waiting"
    assert paid(env, "ord_1015") == []
