"""The operator console: server-rendered pages under /console. No JavaScript; every POST carries a CSRF token."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agent import approvals
from agent.api import Services, ServicesDep
from agent.console import actions, auth, data
from agent.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(prefix="/console", include_in_schema=False)
_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,  # customers write the messages shown here
    undefined=jinja2.StrictUndefined,
)


def _when(value: str | None) -> str:
    """An ISO timestamp as the console shows times: UTC, to the second."""
    if not value:
        return "-"
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_templates.filters["when"] = _when
HEADERS = {
    # No script runs on these pages at all; styles are inline.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
DONE = {
    "approve": "Approved. The refund continues to payment.",
    "reject": "Rejected. The customer will be told.",
    "cancel": "Cancelled. The workflow stops where it is until someone resumes it.",
    "resume": "Resumed from its last checkpoint.",
    "fork": "Forked: a new run of this refund was queued.",
}


@dataclass
class ConsoleState:
    operators: dict[str, auth.Operator]
    secret: bytes
    secure_cookie: bool
    limiter: auth.SignInLimiter = field(default_factory=auth.SignInLimiter)


def setup(app: FastAPI, settings: Settings) -> None:
    """Load the operators (or make the default admin) and the session key; called in the server's lifespan."""
    operators = auth.parse_operators(settings.refund_agent_operators)
    if not operators:
        hashed = auth.hash_password(settings.console_admin_password())
        operators = {"admin": auth.Operator("admin", "admin", hashed)}
        log.warning(
            "console: no operators configured; sign in at /console as 'admin' with the password in %s",
            settings.console_admin_password_file(),
        )
    app.state.console = ConsoleState(operators, settings.session_secret(), settings.public_url.startswith("https"))


def _state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


StateDep = Annotated[ConsoleState, Depends(_state)]


def _session(request: Request, state: StateDep) -> auth.Session | None:
    return auth.decode_session(request.cookies.get(auth.SESSION_COOKIE), state.secret)


SessionDep = Annotated[auth.Session | None, Depends(_session)]


def _finish(response: Response, state: ConsoleState, request: Request, session: auth.Session | None) -> Response:
    response.headers.update(HEADERS)
    if session is not None:
        response.set_cookie(
            auth.SESSION_COOKIE,
            auth.encode_session(session, state.secret),
            max_age=auth.SESSION_SECONDS,
            path="/console",
            httponly=True,
            samesite="lax",
            secure=state.secure_cookie or request.url.scheme == "https",
        )
    return response


def _render(
    request: Request,
    state: ConsoleState,
    session: auth.Session | None,
    template: str,
    status: int = 200,
    **context: Any,
) -> Response:
    fresh = session is None  # every page carries a CSRF token, so anonymous visitors get a session too
    session = session or auth.new_session()
    body = _templates.get_template(template).render(session=session, **context)
    return _finish(HTMLResponse(body, status_code=status), state, request, session if fresh else None)


def _message(request: Request, state: StateDep, session: SessionDep, title: str, text: str, status: int) -> Response:
    return _render(request, state, session, "message.html", status, title=title, text=text)


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/login?next={quote(target)}", status_code=303)


def _guard(
    request: Request, state: ConsoleState, session: auth.Session | None, csrf: str | None, role: auth.Role
) -> Response | None:
    """Refuse a POST without a valid session, a matching CSRF token, or the role it needs."""
    if not auth.csrf_ok(session, csrf):
        return _message(request, state, session, "Refused", "The form has expired or is not from this console.", 403)
    assert session is not None
    if session.operator is None:
        return _message(request, state, session, "Refused", "Sign in first.", 403)
    if not session.may(role):
        return _message(request, state, session, "Refused", f"This needs the {role} role.", 403)
    return None


@router.get("/login")
def login_page(request: Request, state: StateDep, session: SessionDep, next: str = "/console") -> Response:
    return _render(request, state, session, "login.html", next=next, error=None)


@router.post("/login")
def login(
    request: Request,
    state: StateDep,
    session: SessionDep,
    name: Annotated[str, Form(max_length=200)] = "",
    password: Annotated[str, Form(max_length=1000)] = "",
    csrf: Annotated[str | None, Form()] = None,
    next: Annotated[str, Form(max_length=2000)] = "/console",
) -> Response:
    if not auth.csrf_ok(session, csrf):
        return _message(request, state, session, "Refused", "The form has expired; open the sign-in page again.", 403)
    address = request.client.host if request.client else "?"
    if state.limiter.blocked(name, address):
        log.warning("console: sign-in refused from %s: too many failures", address)
        return _render(request, state, session, "login.html", 429, next=next, error="Too many attempts; wait a while.")
    operator = auth.authenticate(state.operators, name, password)
    if operator is None:
        state.limiter.failed(name, address)
        log.warning("console: failed sign-in from %s", address)  # the name field may hold a mistyped password
        return _render(request, state, session, "login.html", 401, next=next, error="Wrong name or password.")
    state.limiter.succeeded(name)
    log.info("console: %s signed in (%s)", operator.name, operator.role)
    target = next if next.startswith("/console") and not next.startswith("//") else "/console"
    return _finish(RedirectResponse(target, status_code=303), state, request, auth.new_session(operator))


@router.post("/logout")
def logout(
    request: Request, state: StateDep, session: SessionDep, csrf: Annotated[str | None, Form()] = None
) -> Response:
    if not auth.csrf_ok(session, csrf):
        return _message(request, state, session, "Refused", "The form has expired or is not from this console.", 403)
    return _finish(RedirectResponse("/console/login", status_code=303), state, request, auth.new_session())


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
    status: str | None = None,
    order: Annotated[str | None, Query(max_length=64)] = None,
    since: str | None = None,
    until: str | None = None,
    page: Annotated[int, Query(ge=1, le=10_000)] = 1,
) -> Response:
    if session is None or session.operator is None:
        return _to_login(request)
    flt = data.RefundFilter(
        status=status if status in data.STATUSES else None,
        order=(order or "").strip() or None,
        since=_day(since),
        until=_day(until),
        page=page,
    )
    items, more = data.list_refunds(flt)
    query = {k: v for k, v in {"status": flt.status, "order": flt.order, "since": since, "until": until}.items() if v}
    return _render(
        request,
        state,
        session,
        "index.html",
        pending=data.pending_approvals(svc.client, datetime.now(UTC)),
        refunds=items,
        more=more,
        flt=flt,
        query=query,
        statuses=data.STATUSES,
    )


@router.get("/refunds/{refund_id}")
def refund_page(
    refund_id: str, request: Request, state: StateDep, session: SessionDep, svc: ServicesDep, done: str | None = None
) -> Response:
    if session is None or session.operator is None:
        return _to_login(request)
    detail = data.refund_detail(svc.client, refund_id)
    if detail is None:
        return _message(request, state, session, "Not found", f"There is no refund {refund_id}.", 404)
    return _render(request, state, session, "refund.html", r=detail, notice=DONE.get(done or ""))


@router.post("/refunds/{refund_id}/decision")
def decide(
    refund_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    svc: ServicesDep,
    decision: Annotated[str, Form()] = "",
    amount: Annotated[str, Form(max_length=32)] = "",
    currency: Annotated[str, Form(max_length=3)] = "",
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    if refused := _guard(request, state, session, csrf, "approver"):
        return refused
    assert session is not None and session.operator is not None
    if decision not in ("approve", "reject"):
        return _message(request, state, session, "Not recorded", "Choose approve or reject.", 400)
    try:
        result = approvals.decide(
            svc.client,
            refund_id=refund_id,
            decision="approve" if decision == "approve" else "reject",
            approver=f"console:{session.operator}",
            amount=Decimal(amount),  # what the operator saw: a decision is bound to it
            currency=currency,
        )
    except (InvalidOperation, ValueError):
        return _message(request, state, session, "Not recorded", "The form did not name an amount.", 400)
    except approvals.ApprovalError as error:
        return _message(request, state, session, "Not recorded", str(error), 409)
    record = result.record
    if record.decision != decision:
        text = f"Refund {refund_id} was already decided: {record.decision} by {record.approver}."
        return _message(request, state, session, "Already decided", text, 409)
    log.info("console: refund %s %s by %s", refund_id, decision, session.operator)
    return RedirectResponse(f"/console/refunds/{quote(refund_id, safe='')}?done={decision}", status_code=303)


def _admin_context(svc: Services, refund_id: str, action: str) -> dict[str, Any] | None:
    detail = data.refund_detail(svc.client, refund_id)
    if detail is None or action not in ("cancel", "resume", "fork"):
        return None
    return {"r": detail, "action": action}


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
        return _to_login(request)
    if not session.may("admin"):
        return _message(request, state, session, "Refused", "This needs the admin role.", 403)
    context = _admin_context(svc, refund_id, action)
    if context is None:
        return _message(request, state, session, "Not found", f"No refund {refund_id} or no such action.", 404)
    return _render(request, state, session, "confirm.html", step=step, **context)


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
    if refused := _guard(request, state, session, csrf, "admin"):
        return refused
    assert session is not None and session.operator is not None
    operator = f"console:{session.operator}"
    suffix = ""
    try:
        if action == "cancel":
            actions.cancel(svc.client, refund_id, operator=operator)
        elif action == "resume":
            actions.resume(svc.client, refund_id, operator=operator)
        elif action == "fork":
            version = svc.settings.refund_agent_app_version
            fork_id = actions.fork(svc.client, refund_id, step=step or 1, operator=operator, app_version=version)
            suffix = f"&fork={quote(fork_id, safe='')}"
        else:
            return _message(request, state, session, "Not found", f"No action {action}.", 404)
    except actions.ActionError as error:
        return _message(request, state, session, "Not done", str(error), 409)
    log.info("console: refund %s %s by %s", refund_id, action, session.operator)
    return RedirectResponse(f"/console/refunds/{quote(refund_id, safe='')}?done={action}{suffix}", status_code=303)
