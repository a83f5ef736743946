"""The customer's answer to their refund's question, by its signed link: ``GET`` shows the question and a form,
``POST`` takes the answer (words, a tracking number, an image) once.

The link names its refund and is signed for that refund's question only, until the question's deadline
(agent/tokens.py ``sign_answer``); an approval link never answers and an answer link never approves. Whoever holds the
link answers as the customer it was sent to: nothing in the body names anyone. An uploaded file is kept only when its
bytes are a JPEG, PNG, GIF or WebP image of at most ``MAX_FILE_BYTES`` (never by its name or declared type), stored
with its type, size and SHA-256, and never served back. Every page escapes what it shows.

``take_answer`` is also how a comment on the refund's help-desk ticket answers (agent/http/helpdesk.py): one answer
per question, recorded by the answer workflow; a repeat of the same delivery gets the answer that stands, another
answer 409, a late one 410, and a refund that asks nothing 409.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import logging
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import HTMLResponse

from agent import questions, replies, tokens
from agent.http.approvals import PAGE_HEADERS
from agent.http.problems import Problem
from agent.question_workflows import answer_here
from agent.services import ServicesDep
from steps.evidence import AnswerFile, CustomerAnswer
from steps.questions import AnswerOutcome, question_of, store_file
from steps.store import app_db

log = logging.getLogger(__name__)
router = APIRouter(tags=["answers"])
#: An answer after a support lead ended the wait (closed unpaid, or sent the refund to a person).
CLOSED = "our support team has taken this request out of waiting for your answer; this answer is not taken"


def take_answer(refund_id: str, answer: CustomerAnswer, *, key: str) -> tuple[int, str, AnswerOutcome | None]:
    """Record ``answer`` to the refund's open question (once: ``key`` names the delivery) and start its second
    judgement; the HTTP status and what to tell the one who answered."""
    with app_db().engine.connect() as conn:
        asked = question_of(conn, refund_id)
    if asked is None:
        return 409, f"refund {refund_id} has not asked a question", None
    if asked.state in ("ended", "to_person"):
        return 409, CLOSED, None
    if asked.state == "expired" or (asked.state == "open" and datetime.now(UTC) >= asked.expires_at):
        return 410, "the time to answer has passed: this refund request was closed without an answer", None
    outcome = answer_here(refund_id, answer.model_copy(update={"question": asked.question}), key=key)
    if outcome.result in ("recorded", "duplicate") and outcome.key == key:
        log.info("refund %s: the customer's answer (%s) recorded", refund_id, answer.via)
        return 202, "Thank you: your answer was recorded, and we are looking at your refund again.", outcome
    if (
        outcome.result == "expired"
        and outcome.question is not None
        and outcome.question.state in ("ended", "to_person")
    ):
        return 409, CLOSED, outcome  # a support lead ended the wait first
    if outcome.result == "expired":
        return 410, "the time to answer has passed: this refund request was closed without an answer", outcome
    if outcome.result == "not_asked":
        return 409, f"refund {refund_id} has not asked a question", outcome
    return 409, "this question was answered already; a second answer is not taken", outcome


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:system-ui;max-width:36rem;margin:2rem auto;"
        "padding:0 1rem}label{display:block;margin:.8rem 0}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>",
        status_code=status,
        headers=PAGE_HEADERS,
    )


def _claims(svc: ServicesDep, refund_id: str, token: str) -> tokens.AnswerClaims:
    try:
        claims = tokens.verify_answer(token, svc.signing_secret)
    except tokens.TokenError as error:
        raise Problem(410 if error.code == "expired" else 401, str(error)) from error
    if claims.refund_id != refund_id:
        raise Problem(404, f"this link does not answer refund {refund_id}")
    return claims


def _fields(question: str) -> str:
    if question == "delivery":
        return (
            "<label><input type='radio' name='received' value='no' required> I still have not received it</label>"
            "<label><input type='radio' name='received' value='yes'> It has arrived</label>"
        )
    if question == "photo":
        return "<label>Photo <input type='file' name='file' accept='image/jpeg,image/png,image/gif,image/webp'></label>"
    return "<label>Tracking number <input name='tracking_number' maxlength='64' required></label>"


@router.get("/answer/{refund_id}/{token}", response_class=HTMLResponse)
def answer_page(refund_id: str, token: str, svc: ServicesDep) -> HTMLResponse:
    """The question the refund asks and, while it is open, a form to answer it."""
    try:
        claims = _claims(svc, refund_id, token)
    except Problem as error:
        return _page("Link not valid", f"<p>{html.escape(error.detail)}</p>", error.status)
    with app_db().engine.connect() as conn:
        asked = question_of(conn, refund_id)
    if asked is None or asked.state != "open":
        said = "answered" if asked is not None and asked.state == "answered" else "closed"
        return _page(
            "Nothing to answer", f"<p>This question was {said} already.</p>", 409 if said == "answered" else 410
        )
    esc = html.escape
    needed = replies.NEEDED[asked.question]
    body = (
        f"<p>About your refund request <b>{esc(refund_id)}</b>.</p><p>{esc(needed)}</p>"
        f"<form method='post' enctype='multipart/form-data' action='/answer/{esc(refund_id)}/{esc(token)}'>"
        f"{_fields(claims.question)}<label>Anything you want to add<br><textarea name='text' rows='4' cols='40' "
        "maxlength='4000'></textarea></label><button>Send</button></form>"
        f"<p>Please answer by {esc(asked.expires_at.strftime('%Y-%m-%d %H:%M UTC'))}.</p>"
    )
    return _page("Your refund: one question", body)


@router.post("/answer/{refund_id}/{token}", response_class=HTMLResponse, status_code=202)
async def answer_form(
    refund_id: str,
    token: str,
    svc: ServicesDep,
    text: Annotated[str, Form(max_length=4000)] = "",
    received: Annotated[Literal["yes", "no"] | None, Form()] = None,
    tracking_number: Annotated[str, Form(max_length=64, pattern=r"^[A-Za-z0-9 -]*$")] = "",
    file: Annotated[UploadFile | None, File()] = None,
) -> HTMLResponse:
    """The answer: 202 recorded (or the same answer again); 409 answered otherwise before (or nothing asked); 410
    past the deadline; 404 a link for another refund; 401 a forged link; 413 a file above 5 MB; 415 a file that is
    not a JPEG, PNG, GIF or WebP image (an HTML page or a script is never kept)."""
    try:
        _claims(svc, refund_id, token)
        content = await file.read(questions.MAX_FILE_BYTES + 1) if file is not None and file.filename else b""
        if len(content) > questions.MAX_FILE_BYTES:
            raise Problem(413, f"the file is larger than {questions.MAX_FILE_BYTES // (1024 * 1024)} MB")
        kind = questions.image_type(content) if content else None
        if content and kind is None:
            raise Problem(415, "only a JPEG, PNG, GIF or WebP image is accepted; the file was not kept")
        digest = hashlib.sha256(content).hexdigest() if content else ""
        parts = {"text": text, "received": received, "tracking": tracking_number.strip(), "file": digest}
        key = "link:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        files: list[AnswerFile] = []
        if content and kind is not None:
            name = file.filename if file is not None and file.filename else "upload"
            files.append(await asyncio.to_thread(_keep, refund_id, name, kind, content))
        answer = CustomerAnswer(
            question="delivery",  # replaced by the question the refund asks
            text=text,
            received=None if received is None else received == "yes",
            tracking_number=tracking_number.strip(),
            files=files,
            via="link",
        )
        status, said, _ = await asyncio.to_thread(take_answer, refund_id, answer, key=key)
    except Problem as error:
        return _page("Answer not taken", f"<p>{html.escape(error.detail)}</p>", error.status)
    title = "Answer recorded" if status == 202 else "Answer not taken"
    return _page(title, f"<p id='answer'>{html.escape(said)}</p>", status)


def _keep(refund_id: str, name: str, kind: str, content: bytes) -> AnswerFile:
    """Store the file only while the refund's question is open (nothing is kept for a question closed or absent)."""
    with app_db().engine.connect() as conn:
        asked = question_of(conn, refund_id)
    if asked is None:
        raise Problem(409, f"refund {refund_id} has not asked a question")
    if asked.state == "expired":
        raise Problem(410, "the time to answer has passed: this refund request was closed without an answer")
    if asked.state == "answered":  # kept with the answer that stands, or refused with this one: never stored now
        digest = hashlib.sha256(content).hexdigest()
        return AnswerFile(name=name[:200], content_type=kind, size=len(content), sha256=digest, stored=False)
    return store_file(app_db().engine, refund_id, name=name, content_type=kind, content=content)
