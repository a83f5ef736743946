"""Approval routes: the API's decision, signed links and Slack buttons. Each establishes who decides itself.

- ``POST /refunds/{id}/approval``: an API client with ``approvals:decide``; it decides as itself.
- ``/approve/{token}``: a link bound to the approver it was sent to; whoever opens it decides as them.
- ``POST /slack/interactions``: Slack's signed request; the clicking user must be on the allow-list, and
  decides as the operator it maps to.

Nobody types a name anywhere. Every path ends in ``agent.approvals.decide``, which refuses the refund's
requester and enforces approval authority.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
from decimal import Decimal
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from agent import approvals, tokens
from agent.decision_checks import decider_refusal
from agent.http.clients import principal_of, requiring
from agent.http.openapi import GUARDED, errors
from agent.http.problems import Problem
from agent.http.views import DecisionView, WaitMoveView
from agent.identity import Principal, approver_names
from agent.question_workflows import LEAD_MOVES, move_wait_here
from agent.services import Services, ServicesDep
from steps import clients
from steps.approval_book import recorded_decision
from steps.notify import slack_message
from steps.records import ApiClient, ApprovalRecord, format_money
from steps.store import app_db, slack_deliveries

log = logging.getLogger(__name__)
router = APIRouter(tags=["approvals"])

_STATUS = {
    "unknown": 404,
    "nothing_pending": 409,
    "mismatch": 409,
    "expired": 410,
    "invalid": 422,
    "above_ask": 422,
    "requester": 403,
    "authority": 403,
    "not_a_decider": 403,
}
#: The link pages carry a capability in their URL: never framed, cached, or sent on as a referrer.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
Decider = Annotated[ApiClient, Depends(requiring("approvals:decide"))]


class DecisionIn(BaseModel):
    """A decision in the refund's currency. Who decides is the API key's client."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    amount: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,12}(\.[0-9]{1,3})?$",
        examples=["4200.00"],
        description="The amount approved: more than 0 and at most the amount the refund awaits, in whole minor "
        "units of its currency (an approver may approve less, never more). Omitted: the amount it awaits. "
        "A rejection is of the amount it awaits.",
    )
    currency: str = Field(
        min_length=3,
        max_length=3,
        examples=["USD"],
        description="The refund's currency (ISO 4217, in any case: `usd` is `USD`); another is 409.",
    )


def refund_decider(refund_id: str, client: Decider, svc: ServicesDep) -> Principal:
    """The calling client, as who decides ``refund_id``: checked before the decision's body is read, so an unknown
    refund is 404 and the refund's requester 403 whatever the body says."""
    approver = principal_of(client)
    refused = decider_refusal(refund_id, approver, approver_names(svc.settings.approvals.operators))
    if refused is not None:
        raise Problem(_STATUS[refused.code], str(refused))
    return approver


def decide(
    svc: Services,
    refund_id: str,
    decision: approvals.Decision,
    approver: Principal,
    via: str,
    amount: Decimal | None,
    currency: str,
    asked: Decimal | None = None,
) -> dict[str, Any]:
    """Record the decision for ``amount`` (None: the amount the refund awaits), first writer wins, and return the
    recorded one. ``asked``: the amount the decider was shown as awaited (a link names it)."""
    try:
        result = approvals.decide(
            svc.decider,
            refund_id=refund_id,
            decision=decision,
            approver=approver,
            via=via,
            amount=amount,
            currency=currency,
            asked=asked,
            authority=svc.settings.approvals.limits,
            deciders=approver_names(svc.settings.approvals.operators),
        )
    except approvals.ApprovalError as error:
        recorded = error.recorded.model_dump(mode="json") if error.recorded else None
        raise Problem(_STATUS.get(error.code, 409), str(error), recorded=recorded) from error
    record = result.record.model_dump(mode="json")
    if result.record.decision != decision:
        raise Problem(409, f"refund {refund_id} was already decided: {result.record.decision}", recorded=record)
    log.info("refund %s: %s by %s via %s", refund_id, decision, approver, via)
    return {**record, "first": result.first}


@router.post(
    "/refunds/{refund_id}/approval",
    response_model=DecisionView,
    responses=errors(
        *GUARDED,
        404,
        409,
        410,
        413,
        415,
        422,
        e403="the client lacks `approvals:decide`, requested the refund (or acts for the person who did), acts for "
        "an operator who may not decide, or the amount is above its approval limit",
        e404="no refund with that id",
        e409="the refund is not waiting for a decision, was decided otherwise (the problem's `recorded` is the "
        "decision that stands), or the currency is not the refund's",
        e422="an amount above the one awaited, zero, or with more decimals than the currency has; an unknown field",
    ),
)
def post_decision(
    refund_id: str, approver: Annotated[Principal, Depends(refund_decider)], body: DecisionIn, svc: ServicesDep
) -> dict[str, Any]:
    """Approve (``amount``: at most the awaited amount, which is the default) or reject, as the calling client
    (scope ``approvals:decide``; never the refund's requester). Repeats get the recorded decision; a different
    one is 409; an amount above the awaited one, zero, or with more decimals than the currency has is 422."""
    amount = Decimal(body.amount) if body.amount is not None else None
    return decide(svc, refund_id, body.decision, approver, "api", amount, body.currency.upper())


class WaitMoveIn(BaseModel):
    """A support lead's move on a refund waiting for its customer. Who moves it is the API key's client."""

    model_config = ConfigDict(extra="forbid")

    move: Literal["end", "person"] = Field(
        description="`end`: close the refund unpaid, the customer told; `person`: judge it again for an approver"
    )


@router.post(
    "/refunds/{refund_id}/question",
    response_model=WaitMoveView,
    responses=errors(
        *GUARDED,
        404,
        409,
        413,
        415,
        422,
        e403="the client lacks `approvals:decide`, requested the refund (or acts for the person who did), or acts "
        "for an operator who may not decide",
        e404="no refund with that id, or one that asked its customer nothing",
        e409="the refund is not waiting for its customer: it was answered, expired, or moved before (the problem's "
        "`state` says which)",
        e422="a move other than `end` or `person`; an unknown field",
    ),
)
def move_wait(refund_id: str, lead: Annotated[Principal, Depends(refund_decider)], body: WaitMoveIn) -> dict[str, Any]:
    """End a refund's wait for its customer (``end``: closed unpaid, the customer told) or send it to a person
    (``person``), as the calling client (scope ``approvals:decide``; never the refund's requester). One move per
    refund, and only while its question is open: the customer's answer or the deadline, when first, stands."""
    moved = move_wait_here(refund_id, body.move, str(lead))
    if moved is None:
        raise Problem(404, f"refund {refund_id} asked its customer nothing")
    if not moved.done:
        raise Problem(
            409, f"refund {refund_id} is not waiting for its customer: its question is {moved.state}", state=moved.state
        )
    log.info("refund %s: wait %s by %s via api", refund_id, LEAD_MOVES[body.move], lead)
    return {"refund_id": refund_id, "move": body.move, "question_state": LEAD_MOVES[body.move], "by": str(lead)}


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:system-ui;max-width:36rem;margin:2rem auto;"
        "padding:0 1rem}button{font-size:1.1rem;padding:.5rem 1.2rem;margin-right:.5rem}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>",
        status_code=status,
        headers=PAGE_HEADERS,
    )


def link_approver(svc: Services, claims: tokens.ApprovalClaims) -> Principal:
    """The principal a link decides as, if it may still decide: an operator still configured with a role that
    decides, or a live client with ``approvals:decide``. Slack's tokens decide only through Slack."""
    try:
        approver = Principal.parse(claims.approver)
    except ValueError as error:
        raise Problem(403, "this link is for Slack's buttons; decide there or in the console") from error
    if approver.kind == "operator" and approver.name in approver_names(svc.settings.approvals.operators):
        return approver
    if approver.kind == "client":
        found = clients.get_client(app_db().engine, approver.name)
        if found is not None and found.allows("approvals:decide"):
            return principal_of(found)  # acting for its operator, as over the API
    raise Problem(403, f"{approver} may no longer decide refunds")


def _recorded_text(record: ApprovalRecord) -> str:
    money = format_money(record.amount, record.currency)
    when = record.decided_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"{record.decision} for {money} by {record.approver} ({record.via or 'recorded'}) at {when}"


@router.get("/approve/{token}", response_class=HTMLResponse)
def approval_page(token: str, svc: ServicesDep, decision: str | None = None) -> HTMLResponse:
    """The refund (amount, order, the agent's reason) and, while undecided, Approve and Reject buttons."""
    try:
        claims = tokens.verify(token, svc.signing_secret)
        approver = link_approver(svc, claims)
    except tokens.TokenError as error:
        status = 410 if error.code == "expired" else 401
        return _page("Approval link not valid", f"<p>{html.escape(str(error))}</p>", status)
    except Problem as error:
        return _page("Approval link not valid", f"<p>{html.escape(error.detail)}</p>", error.status)
    pending = approvals.pending_request(claims.refund_id) or {}
    with app_db().engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT order_id FROM refunds WHERE refund_id = :r"), {"r": claims.refund_id}
        ).first()
        recorded = recorded_decision(conn, claims.refund_id)
    esc = html.escape
    body = (
        f"<p>Refund <b>{esc(claims.refund_id)}</b> of <b>{esc(format_money(claims.amount, claims.currency))}</b>"
        f" on order <b>{esc(row.order_id if row else '?')}</b>.</p>"
    )
    if recorded is not None:  # decided (or expired): what stands, never buttons
        return _page("Refund decided", body + f"<p id='decision'>Decided: {esc(_recorded_text(recorded))}.</p>")
    body += (
        f"<p>Reason given by the agent: {esc(str(pending.get('reason', '')))}</p>"
        f"<p>You decide as <b>{esc(str(approver))}</b>. The link expires {esc(claims.expires_at.isoformat())}.</p>"
        f"<form method='post' action='/approve/{esc(token)}'><p><label>Amount to approve ({esc(claims.currency)}) "
        f"<input name='amount' id='amount' value='{esc(str(claims.amount))}' inputmode='decimal' size='12'></label>"
        " (you may approve less than asked, never more)</p>"
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
    amount: Annotated[str | None, Form(max_length=32)] = None,
) -> HTMLResponse:
    """The page's buttons: the decision is the link's approver's; an approval may be for less than the link's
    amount (the amount asked), never more. Without ``amount``: the amount asked."""
    try:
        claims = tokens.verify(token, svc.signing_secret)
        approver = link_approver(svc, claims)
        approving = approvals.parse_amount(amount) if decision == "approve" and amount else None
        args = (svc, claims.refund_id, decision, approver, "link", approving, claims.currency)
        record = decide(*args, asked=claims.amount)
    except tokens.TokenError as error:
        status = 410 if error.code == "expired" else 401
        return _page("Approval link not valid", f"<p>{html.escape(str(error))}</p>", status)
    except approvals.ApprovalError as error:
        return _page("Decision not recorded", f"<p>{html.escape(str(error))}</p>", 422)
    except Problem as error:
        return _page("Decision not recorded", f"<p>{html.escape(error.detail)}</p>", error.status)
    money = format_money(Decimal(record["amount"]), record["currency"])
    text = f"{record['decision']} for {money} by {record['approver']}"
    return _page("Decision recorded", f"<p id='decision'>{html.escape(text)}.</p>")


def _first_delivery(signature: str) -> bool:
    """Remember each signed Slack request once; a replay of the same bytes is refused."""
    try:
        with app_db().engine.begin() as conn:
            conn.execute(slack_deliveries.insert().values(signature=signature))
        return True
    except sa.exc.IntegrityError:
        return False


def slack_approver(svc: Services, payload: dict[str, Any]) -> tuple[Principal, str]:
    """The operator an allow-listed Slack user decides as, and the Slack id (``slack:<team>/<user>``) it used."""
    user = payload.get("user") or {}
    team = user.get("team_id") or (payload.get("team") or {}).get("id") or ""
    slack_id = f"{team}/{user.get('id') or ''}"
    operator = svc.settings.approvals.slack_approvers.get(slack_id)
    if operator is None:
        raise Problem(403, f"Slack user {slack_id} is not an approver here")
    if operator not in approver_names(svc.settings.approvals.operators):
        raise Problem(403, f"Slack user {slack_id} maps to {operator}, who may not decide refunds")
    return Principal("operator", operator), f"slack:{slack_id}"


@router.post(
    "/slack/interactions",
    responses=errors(
        400,
        401,
        404,
        409,
        503,
        e400="not a Slack block_actions payload, or an unknown action",
        e401="Slack's signature missing, wrong or stale",
        e404="Slack is not configured on this service",
        e409="this Slack request was already processed (a replay)",
    ),
)
async def slack_interactions(request: Request, svc: ServicesDep) -> JSONResponse:
    """Slack's Approve/Reject buttons: signature (v0, 5-minute window) checked, replays refused, and the clicking
    user must be on ``SLACK_APPROVERS``; the decision is recorded as their operator, by Slack id."""
    secret = svc.settings.channels.slack_signing_secret
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
        decision = action["action_id"]
        token = str(action["value"])
    except (KeyError, IndexError, ValueError, TypeError) as error:
        raise Problem(400, "not a Slack block_actions payload") from error
    if decision not in ("approve", "reject"):
        raise Problem(400, f"unknown action {decision!r}")
    try:
        approver, via = slack_approver(svc, payload)
        claims = tokens.verify(token, svc.signing_secret)
        if claims.approver != approvals.SLACK_APPROVER:
            raise Problem(403, "this token is not one of Slack's buttons")
        args = (svc, claims.refund_id, decision, approver, via, claims.amount, claims.currency)
        record = await asyncio.to_thread(decide, *args)
        text = f"{record['decision']} by {record['approver']} ({via}): refund {claims.refund_id}"
    except tokens.TokenError as error:
        text = f"Not recorded: {error}"
    except Problem as error:
        text = f"Not recorded: {error.detail}"
    if url := payload.get("response_url"):
        await asyncio.to_thread(WebhookClient(url).send_dict, {**slack_message(text), "replace_original": True})
    return JSONResponse({"text": text})
