"""Approval routes: signed links, the confirmation page and Slack buttons. Each carries its own proof."""

from __future__ import annotations

import asyncio
import html
import json
import logging
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

import sqlalchemy as sa
from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from agent import approvals, tokens
from agent.http.problems import Problem
from agent.services import Services, ServicesDep
from steps.records import format_money
from steps.store import app_db, slack_deliveries

log = logging.getLogger(__name__)
router = APIRouter(tags=["approvals"])

_STATUS = {"nothing_pending": 409, "mismatch": 409, "expired": 410, "invalid": 422}


class DecisionIn(BaseModel):
    decision: Literal["approve", "reject"]
    approver: str = Field(min_length=1, max_length=200)
    token: str = Field(min_length=10, max_length=2000)


def decide(svc: Services, refund_id: str, decision: approvals.Decision, approver: str, token: str) -> dict[str, Any]:
    """Verify the token, record the decision (first writer wins) and return the recorded one."""
    try:
        claims = tokens.verify(token, svc.signing_secret)
    except tokens.TokenError as error:
        raise Problem(410 if error.code == "expired" else 401, str(error)) from error
    if claims.refund_id != refund_id:
        raise Problem(403, "this approval token is for another refund")
    try:
        result = approvals.decide(
            svc.decider,
            refund_id=refund_id,
            decision=decision,
            approver=approver,
            amount=claims.amount,
            currency=claims.currency,
        )
    except approvals.ApprovalError as error:
        recorded = error.recorded.model_dump(mode="json") if error.recorded else None
        raise Problem(_STATUS.get(error.code, 409), str(error), recorded=recorded) from error
    record = result.record.model_dump(mode="json")
    if result.record.decision != decision:
        raise Problem(409, f"refund {refund_id} was already decided: {result.record.decision}", recorded=record)
    return {**record, "first": result.first}


@router.post("/refunds/{refund_id}/approval")
def post_decision(refund_id: str, body: DecisionIn, svc: ServicesDep) -> dict[str, Any]:
    """Approve or reject with a signed token. Repeats get the recorded decision; a different one is 409."""
    return decide(svc, refund_id, body.decision, body.approver, body.token)


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:system-ui;max-width:36rem;margin:2rem auto;"
        "padding:0 1rem}button{font-size:1.1rem;padding:.5rem 1.2rem;margin-right:.5rem}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>",
        status_code=status,
    )


@router.get("/approve/{token}", response_class=HTMLResponse)
def approval_page(token: str, svc: ServicesDep, decision: str | None = None) -> HTMLResponse:
    """A confirmation page: amount, order and reason, with Approve and Reject buttons."""
    try:
        claims = tokens.verify(token, svc.signing_secret)
    except tokens.TokenError as error:
        return _page(
            "Approval link not valid", f"<p>{html.escape(str(error))}</p>", 410 if error.code == "expired" else 401
        )
    pending = approvals.pending_request(claims.refund_id) or {}
    with app_db().engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT order_id FROM refunds WHERE refund_id = :r"), {"r": claims.refund_id}
        ).first()
    esc = html.escape
    body = (
        f"<p>Refund <b>{esc(claims.refund_id)}</b> of <b>{esc(format_money(claims.amount, claims.currency))}</b>"
        f" on order <b>{esc(row.order_id if row else '?')}</b>.</p>"
        f"<p>Reason given by the agent: {esc(str(pending.get('reason', '')))}</p>"
        f"<p>Link expires {esc(claims.expires_at.isoformat())}.</p>"
        f"<form method='post' action='/approve/{esc(token)}'>"
        "<p><label>Your name <input name='approver' required maxlength='200'></label></p>"
        f"<button name='decision' value='approve'{' autofocus' if decision == 'approve' else ''}>Approve</button>"
        f"<button name='decision' value='reject'{' autofocus' if decision == 'reject' else ''}>Reject</button>"
        "</form>"
    )
    return _page("Refund approval", body)


@router.post("/approve/{token}", response_class=HTMLResponse)
def approval_form(
    token: str,
    svc: ServicesDep,
    decision: Annotated[Literal["approve", "reject"], Form()],
    approver: Annotated[str, Form(max_length=200)],
) -> HTMLResponse:
    try:
        claims = tokens.verify(token, svc.signing_secret)
        record = decide(svc, claims.refund_id, decision, approver.strip(), token)
    except tokens.TokenError as error:
        status = 410 if error.code == "expired" else 401
        return _page("Approval link not valid", f"<p>{html.escape(str(error))}</p>", status)
    except Problem as error:
        return _page("Decision not recorded", f"<p>{html.escape(error.detail)}</p>", error.status)
    return _page("Decision recorded", f"<p>{html.escape(record['decision'])} by {html.escape(record['approver'])}.</p>")


def _first_delivery(signature: str) -> bool:
    """Remember each signed Slack request once; a replay of the same bytes is refused."""
    try:
        with app_db().engine.begin() as conn:
            conn.execute(slack_deliveries.insert().values(signature=signature))
        return True
    except sa.exc.IntegrityError:
        return False


@router.post("/slack/interactions")
async def slack_interactions(request: Request, svc: ServicesDep) -> JSONResponse:
    """Slack's Approve/Reject buttons: signature (v0, 5-minute window) checked, replays refused."""
    secret = svc.settings.slack_signing_secret
    if secret is None:
        raise Problem(404, "Slack is not configured on this service")
    body = await request.body()
    signature = request.headers.get("X-Slack-Signature", "")
    verifier = SignatureVerifier(secret.get_secret_value())
    stamp = request.headers.get("X-Slack-Request-Timestamp", "")
    if not stamp.isdigit() or not verifier.is_valid(body, stamp, signature):
        raise Problem(401, "Slack signature missing, wrong or stale")
    if not await asyncio.to_thread(_first_delivery, signature):
        raise Problem(409, "this Slack request was already processed")
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
        action = payload["actions"][0]
        user = payload["user"]
        decision = action["action_id"]
        token = str(action["value"])
    except (KeyError, IndexError, ValueError, TypeError) as error:
        raise Problem(400, "not a Slack block_actions payload") from error
    if decision not in ("approve", "reject"):
        raise Problem(400, f"unknown action {decision!r}")
    approver = f"slack:{user.get('username') or user.get('name') or user.get('id')}"
    try:
        claims = tokens.verify(token, svc.signing_secret)
        record = await asyncio.to_thread(decide, svc, claims.refund_id, decision, approver, token)
        text = f"{record['decision']} by {record['approver']}: refund {claims.refund_id}"
    except tokens.TokenError as error:
        text = f"Not recorded: {error}"
    except Problem as error:
        text = f"Not recorded: {error.detail}"
    if url := payload.get("response_url"):
        await asyncio.to_thread(WebhookClient(url).send, text=text, replace_original=True)
    return JSONResponse({"text": text})
