"""The operator console: server-rendered pages under /console. No JavaScript; every POST carries a CSRF token."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from agent import approvals
from agent.console import actions, data, pages
from agent.console.pages import SessionDep, StateDep
from agent.console.phases import PHASES
from agent.identity import Principal
from agent.question_workflows import LEAD_MOVES, move_wait_here
from agent.services import Services, ServicesDep

log = logging.getLogger(__name__)
router = APIRouter(prefix="/console", include_in_schema=False)
ADMIN_ACTIONS: tuple[actions.Action, ...] = ("cancel", "resume", "fork")
DONE = {
    "approve": "Approved. The refund continues to payment.",
    "reject": "Rejected. The customer will be told.",
    "cancel": "Stopped. Nothing more happens to this refund until someone resumes it.",
    "resume": "Resumed where it stopped.",
    "fork": "Retrying the payment: a new run of this refund was queued with the same payment key.",
    "wait-ended": "The wait was ended: the refund is closed unpaid and the customer is told.",
    "to-person": "Sent to a person: the refund is judged again and waits for an approver.",
}
STANDING = {
    "answered": "answered by the customer",
    "expired": "left unanswered past its deadline",
    "ended": "ended by a support lead",
    "to_person": "sent to a person by a support lead",
}


def _day(value: str | None) -> date | None:
    try:
        return date.fromisoformat(value) if value else None
    except ValueError:
        return None


@router.get("")
def home(
    request: Request,
    state: StateDep,
    session: SessionDep,
    svc: ServicesDep,
    phase: str | None = None,
    order: Annotated[str | None, Query(max_length=64)] = None,
    since: str | None = None,
    until: str | None = None,
    page: Annotated[int, Query(ge=1, le=10_000)] = 1,
) -> Response:
    if session is None or session.operator is None:
        return pages.to_login(request, state)
    flt = data.RefundFilter(
        phase=phase if phase in PHASES else None,
        order=(order or "").strip() or None,
        since=_day(since),
        until=_day(until),
        page=page,
    )
    items, more = data.list_refunds(flt)
    failed_count, failed = data.failed_deliveries()
    query = {k: v for k, v in {"phase": flt.phase, "order": flt.order, "since": since, "until": until}.items() if v}
    return pages.render(
        request,
        state,
        session,
        "index.html",
        pending=data.pending_approvals(svc.client, datetime.now(UTC)),
        failed_count=failed_count,
        failed=failed,
        refunds=items,
        more=more,
        flt=flt,
        query=query,
        phases=PHASES.values(),
    )


@router.get("/refunds/{refund_id}")
def refund_page(
    refund_id: str, request: Request, state: StateDep, session: SessionDep, svc: ServicesDep, done: str | None = None
) -> Response:
    if session is None or session.operator is None:
        return pages.to_login(request, state)
    detail = data.refund_detail(svc.client, refund_id, prices=svc.settings.model.prices)
    if detail is None:
        return pages.message(request, state, session, "Not found", f"There is no refund {refund_id}.", 404)
    # Only the actions the refund's state allows are offered; the others say why not.
    offered = {a: actions.refusal(svc.client, refund_id, a) for a in ADMIN_ACTIONS} if session.may("admin") else {}
    links = {
        run["workflow_id"]: svc.settings.console.dbos_console_link(run["workflow_id"]) for run in detail["executions"]
    }
    return pages.render(
        request, state, session, "refund.html", r=detail, notice=DONE.get(done or ""), actions=offered, dbos_links=links
    )


@router.post("/refunds/{refund_id}/decision")
def decide(
    refund_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    svc: ServicesDep,
    decision: Annotated[str, Form()] = "",
    amount: Annotated[str, Form(max_length=32)] = "",
    asked: Annotated[str, Form(max_length=32)] = "",
    currency: Annotated[str, Form(max_length=3)] = "",
    confirmed: Annotated[str, Form(max_length=3)] = "",
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    """Approve (``amount``: at most the ``asked`` amount the page showed) or reject. The first POST shows a
    confirmation naming the amount; only the confirmation's POST (``confirmed=yes``) decides."""
    if refused := pages.guard(request, state, session, csrf, "approver"):
        return refused
    assert session is not None and session.operator is not None
    if decision not in ("approve", "reject"):
        return pages.message(request, state, session, "Not recorded", "Choose approve or reject.", 400)
    chosen: approvals.Decision = "approve" if decision == "approve" else "reject"
    approver = Principal("operator", session.operator)  # the signed-in operator, never a typed name
    try:
        shown = approvals.parse_amount(asked or amount)  # what the operator saw as awaited: a decision is bound to it
        kwargs: dict[str, Any] = {
            "refund_id": refund_id,
            "decision": chosen,
            "approver": approver,
            "amount": approvals.parse_amount(amount) if chosen == "approve" else shown,
            "currency": currency,
            "asked": shown,
            "authority": svc.settings.approvals.limits,
        }
        if confirmed != "yes":  # nothing is recorded: the operator reads what they are about to decide
            checked = approvals.check(**kwargs)
            if checked.standing is None:
                page = "approve_confirm.html"
                return pages.render(
                    request,
                    state,
                    session,
                    page,
                    refund_id=refund_id,
                    decision=chosen,
                    amount=checked.amount,
                    currency=currency,
                    asked=checked.request,
                )
            result = approvals.DecisionResult(record=checked.standing, first=False)
        else:
            result = approvals.decide(svc.decider, via="console", **kwargs)
    except approvals.ApprovalError as error:
        codes = {"unknown": 404, "requester": 403, "authority": 403, "invalid": 400, "above_ask": 400}
        status = codes.get(error.code, 409)
        return pages.message(request, state, session, "Not recorded", str(error), status)
    record = result.record
    if not result.first:  # decided before (by anyone, even the same way): nothing was recorded now
        text = f"Refund {refund_id} was already decided: {record.decision} by {record.approver}."
        return pages.message(request, state, session, "Already decided", text, 409)
    log.info("console: refund %s %s by %s", refund_id, decision, session.operator)
    return RedirectResponse(f"/console/refunds/{quote(refund_id, safe='')}?done={decision}", status_code=303)


@router.post("/refunds/{refund_id}/wait")
def end_wait(
    refund_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    move: Annotated[str, Form(max_length=16)] = "",
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    """A support lead (the approver role) ends a refund's wait for its customer: ``end`` closes it unpaid with the
    customer told, ``person`` sends it to an approver. Once per refund, and only while the question is open: an
    answer or the deadline that came first stands."""
    if refused := pages.guard(request, state, session, csrf, "approver"):
        return refused
    assert session is not None and session.operator is not None
    if move not in LEAD_MOVES:
        return pages.message(request, state, session, "Not done", "Choose to end the wait or send it to a person.", 400)
    operator = str(Principal("operator", session.operator))  # the signed-in operator, never a typed name
    moved = move_wait_here(refund_id, move, operator)
    if moved is None:
        return pages.message(
            request, state, session, "Not found", f"Refund {refund_id} asked its customer nothing.", 404
        )
    if not moved.done:
        said = STANDING.get(moved.state, moved.state)
        text = f"Refund {refund_id} is not waiting for its customer any more: its question was {said}."
        return pages.message(request, state, session, "Not done", text, 409)
    log.info("console: refund %s wait %s by %s", refund_id, LEAD_MOVES[move], session.operator)
    done = "wait-ended" if move == "end" else "to-person"
    return RedirectResponse(f"/console/refunds/{quote(refund_id, safe='')}?done={done}", status_code=303)


def _admin_context(svc: Services, refund_id: str, action: str) -> dict[str, Any] | None:
    detail = data.refund_detail(svc.client, refund_id, prices=svc.settings.model.prices)
    if detail is None or action not in ADMIN_ACTIONS:
        return None
    refused = actions.refusal(svc.client, refund_id, action)
    return {"r": detail, "action": action, "refused": refused}


@router.get("/refunds/{refund_id}/confirm")
def confirm_page(
    refund_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    svc: ServicesDep,
    action: str = "",
    step: int | None = None,
) -> Response:
    if session is None or session.operator is None:
        return pages.to_login(request, state)
    if not session.may("admin"):
        return pages.message(request, state, session, "Refused", "This needs the admin role.", 403)
    context = _admin_context(svc, refund_id, action)
    if context is None:
        return pages.message(request, state, session, "Not found", f"No refund {refund_id} or no such action.", 404)
    return pages.render(request, state, session, "confirm.html", step=step, **context)


@router.post("/refunds/{refund_id}/{action}")
def admin_action(
    refund_id: str,
    action: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    svc: ServicesDep,
    step: Annotated[int | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    if refused := pages.guard(request, state, session, csrf, "admin"):
        return refused
    assert session is not None and session.operator is not None
    operator = str(Principal("operator", session.operator))
    address = pages.client_address(request, state)
    suffix = ""
    try:
        if action == "cancel":
            actions.cancel(svc.client, refund_id, operator=operator, address=address)
        elif action == "resume":
            actions.resume(svc.client, refund_id, operator=operator, address=address)
        elif action == "fork":
            version = svc.settings.runtime.app_version
            fork_id = actions.fork(
                svc.client, refund_id, step=step or 1, operator=operator, address=address, app_version=version
            )
            suffix = f"&fork={quote(fork_id, safe='')}"
        else:
            return pages.message(request, state, session, "Not found", f"No action {action}.", 404)
    except actions.ActionError as error:
        return pages.message(request, state, session, "Not done", str(error), 409)
    log.info("console: refund %s %s by %s", refund_id, action, session.operator)
    return RedirectResponse(f"/console/refunds/{quote(refund_id, safe='')}?done={action}{suffix}", status_code=303)
