"""The admins' sessions page: who is signed in, from where, until when; revoke any session (confirmed)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from agent.console import auth, pages, sessions
from agent.console.pages import SessionDep, StateDep
from steps.console_sessions import OperatorSession

router = APIRouter(prefix="/console", include_in_schema=False)


def _admin_only(request: Request, state: pages.ConsoleState, session: auth.Session | None) -> Response | None:
    if session is None or session.operator is None:
        return pages.to_login(request, state)
    if not session.may("admin"):
        return pages.message(request, state, session, "Refused", "This needs the admin role.", 403)
    return None


def _listed(state: pages.ConsoleState, request: Request, session: auth.Session) -> list[OperatorSession]:
    seen_by = f"{session.operator} ({pages.client_address(request, state)})"
    return sessions.active(state.operators, seen_by, state.oidc_credentials)


@router.get("/sessions")
def sessions_page(request: Request, state: StateDep, session: SessionDep, done: str | None = None) -> Response:
    if refused := _admin_only(request, state, session):
        return refused
    assert session is not None
    rows = _listed(state, request, session)
    return pages.render(
        request,
        state,
        session,
        "sessions.html",
        rows=rows,
        idle=auth.SESSION_IDLE,
        lifetime=auth.SESSION_LIFETIME,
        notice="Session revoked: its cookie signs no one in any more." if done == "revoked" else None,
    )


@router.get("/sessions/{key}/revoke")
def revoke_page(key: str, request: Request, state: StateDep, session: SessionDep) -> Response:
    if refused := _admin_only(request, state, session):
        return refused
    assert session is not None
    found = next((row for row in _listed(state, request, session) if row.session_hash == key), None)
    if found is None:
        return pages.message(request, state, session, "Not found", "No such session: it may have ended.", 404)
    return pages.render(request, state, session, "session_revoke.html", s=found, idle=auth.SESSION_IDLE)


@router.post("/sessions/{key}/revoke")
def revoke(
    key: str, request: Request, state: StateDep, session: SessionDep, csrf: Annotated[str | None, Form()] = None
) -> Response:
    if refused := pages.guard(request, state, session, csrf, "admin"):
        return refused
    assert session is not None and session.operator is not None
    address = pages.client_address(request, state)
    ended = sessions.revoke(key, event="console_session_revoked", by=session.operator, address=address)
    if ended is None:
        return pages.message(request, state, session, "Not found", "No such session: it may have ended.", 404)
    if key == session.ref:  # an admin who revokes their own session is signed out
        response = pages.finish(RedirectResponse("/console/login", status_code=303), state, request)
        pages.end_session_cookie(response)
        return response
    return pages.finish(RedirectResponse("/console/sessions?done=revoked", status_code=303), state, request)
