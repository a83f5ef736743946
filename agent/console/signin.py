"""Sign-in and sign-out pages. Failed sign-ins are throttled per name (a growing, capped delay) and per
client address, in the database every API process shares (``steps.sign_in_throttle``)."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from agent.console import auth, oidc_views, pages, sessions
from agent.console.pages import SessionDep, StateDep
from steps import sign_in_throttle
from steps.store import app_db

log = logging.getLogger(__name__)
router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login")
def login_page(request: Request, state: StateDep, session: SessionDep, next: str = "/console") -> Response:
    return pages.render(request, state, session, "login.html", **_context(state, next, None))


def _context(state: StateDep, next: str, error: str | None) -> dict[str, Any]:
    return {
        "next": next,
        "error": error,
        "generated_admin": state.generated_admin,
        "oidc": state.oidc is not None,
        "password_sign_in": state.password_sign_in,
    }


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
    if not state.password_sign_in:
        text = "Password sign-in is off here: sign in with the company's identity provider."
        return pages.message(request, state, session, "Refused", text, 403)
    if not auth.csrf_ok(session, csrf):
        return pages.message(
            request, state, session, "Refused", "The form has expired; open the sign-in page again.", 403
        )
    address = pages.client_address(request, state)
    digest = auth.name_digest(state.secret, name)

    def again(status: int, error: str) -> Response:
        return pages.render(request, state, session, "login.html", status, **_context(state, next, error))

    with app_db().engine.begin() as conn:
        attempt = sign_in_throttle.begin_attempt(
            conn,
            name_digest=digest,
            address=address,
            now=datetime.now(UTC),
            backoff=auth.BACKOFF,
            limit=auth.ADDRESS_LIMIT,
        )
    if not attempt.allowed:
        # Refused before the password is looked at, the right one too: it counts for nothing.
        seconds = max(1, math.ceil(attempt.retry_after.total_seconds()))
        log.warning(
            "console: sign-in from %s refused for %d s: too many failures (%s)", address, seconds, attempt.refused_by
        )
        refused = again(429, f"Too many attempts; try again in {seconds} s.")
        refused.headers["Retry-After"] = str(seconds)
        return refused
    operator = auth.authenticate(state.operators, name, password)
    if operator is None:
        sessions.sign_in_failed(name if name in state.operators else None, address, attempt)
        return again(401, "Wrong name or password.")
    session_id = sessions.start(
        operator,
        name_digest=digest,
        address=address,
        user_agent=request.headers.get("user-agent", ""),
        replacing=session,
    )
    target = next if next.startswith("/console") and not next.startswith("//") else "/console"
    response = pages.finish(RedirectResponse(target, status_code=303), state, request)
    pages.start_session_cookie(response, state, request, session_id)
    return response


@router.post("/logout")
def logout(
    request: Request, state: StateDep, session: SessionDep, csrf: Annotated[str | None, Form()] = None
) -> Response:
    if not auth.csrf_ok(session, csrf):
        return pages.message(
            request, state, session, "Refused", "The form has expired or is not from this console.", 403
        )
    assert session is not None
    if session.ref is not None:  # the row goes: a copy of the cookie signs no one in any more
        by = session.operator or ""
        sessions.revoke(session.ref, event="console_signed_out", by=by, address=pages.client_address(request, state))
    response = oidc_views.signed_out(request, state, session.operator)  # and the provider's session, if any
    pages.end_session_cookie(response)
    return response
