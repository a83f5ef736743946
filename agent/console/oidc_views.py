"""Sign-in through the company's OpenID provider: ``/console/auth/start`` sends the browser there, and the
provider sends it back to ``/console/auth/callback`` with a code.

Between the two, a cookie signed with the session secret carries the flow's state, nonce and PKCE verifier
(10 minutes; it grants nothing). A failed sign-in is an HTML page with a status code and is audited; a
successful one starts a server-side session like a password sign-in does.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from agent.console import auth, pages, sessions
from agent.console.oidc import Flow, Provider, SignInError
from agent.console.pages import SessionDep, StateDep
from steps import audit
from steps.store import app_db

log = logging.getLogger(__name__)
router = APIRouter(prefix="/console/auth", include_in_schema=False)

FLOW_COOKIE = "refund_console_oidc_flow"
ID_TOKEN_COOKIE = "refund_console_oidc_id"  # noqa: S105 (a cookie name)
"""The ID token of the sign-in, kept only to name the session when asking the provider to end it (sign-out)."""
FLOW_SECONDS = 600


FLOW_PURPOSE = b"console-oidc-flow:"


def encode_flow(flow: Flow, secret: bytes, *, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + FLOW_SECONDS)
    return auth.sign_values([flow.state, flow.nonce, flow.verifier, flow.next, expires], secret, FLOW_PURPOSE)


def decode_flow(cookie: str | None, secret: bytes, *, now: float | None = None) -> Flow | None:
    """The flow this browser started here, or None (missing, forged, malformed, older than 10 minutes)."""
    values = auth.signed_values(cookie, secret, FLOW_PURPOSE)
    if values is None or len(values) != 5:
        return None
    state, nonce, verifier, next_page, expires = values
    if int(expires) < (time.time() if now is None else now):
        return None
    return Flow(str(state), str(nonce), str(verifier), str(next_page))


def _target(next_page: str) -> str:
    return next_page if next_page.startswith("/console") and not next_page.startswith("//") else "/console"


def _provider(state: pages.ConsoleState) -> Provider:
    if state.oidc is None:
        raise SignInError(404, "Not configured", "This console does not sign in through an identity provider.")
    return state.oidc


def _refused(request: Request, state: pages.ConsoleState, session: auth.Session | None, error: SignInError) -> Response:
    address = pages.client_address(request, state)
    with app_db().engine.begin() as conn:
        payload = {"operator": None, "address": address, "via": "oidc", "reason": error.title}
        audit.append(conn, refund_id="", event="console_sign_in_failed", payload=payload, now=datetime.now(UTC))
    log.warning("console: sign-in through the provider from %s failed: %s", address, error.title)
    response = pages.message(request, state, session, error.title, error.text, error.status)
    response.delete_cookie(FLOW_COOKIE, path="/console/auth")
    return response


@router.get("/start")
def start(request: Request, state: StateDep, session: SessionDep, next: str = "/console") -> Response:
    try:
        url, flow = _provider(state).begin(_target(next[:2000]))
    except SignInError as error:
        return _refused(request, state, session, error)
    response = pages.finish(RedirectResponse(url, status_code=303), state, request)
    response.set_cookie(
        FLOW_COOKIE,
        encode_flow(flow, state.secret),
        max_age=FLOW_SECONDS,
        path="/console/auth",
        httponly=True,
        samesite="lax",  # sent on the provider's top-level redirect back here
        secure=state.secure_cookie or request.url.scheme == "https",
    )
    return response


@router.get("/callback")
def callback(request: Request, state: StateDep, session: SessionDep) -> Response:
    params = {k: v[:4000] for k, v in request.query_params.items()}
    try:
        provider = _provider(state)
        flow = decode_flow(request.cookies.get(FLOW_COOKIE), state.secret)
        if flow is None:
            raise SignInError(
                400,
                "Sign-in not recognised",
                "This sign-in was not started in this browser, or took longer than 10 minutes. "
                "Open the sign-in page and sign in again.",
            )
        identity = provider.finish(flow, params)
    except SignInError as error:
        return _refused(request, state, session, error)
    operator = auth.Operator(identity.operator, identity.role, "")
    address = pages.client_address(request, state)
    session_id = sessions.start(
        operator,
        name_digest=auth.name_digest(state.secret, identity.operator),
        address=address,
        user_agent=request.headers.get("user-agent", ""),
        replacing=session,
        oidc=provider.config.credentials,
        identity={"via": "oidc", "subject": identity.subject, "email": identity.email, "groups": list(identity.groups)},
    )
    response = pages.finish(RedirectResponse(_target(flow.next), status_code=303), state, request)
    pages.start_session_cookie(response, state, request, session_id)
    response.delete_cookie(FLOW_COOKIE, path="/console/auth")
    response.set_cookie(
        ID_TOKEN_COOKIE,
        identity.id_token,
        max_age=int(auth.SESSION_LIFETIME.total_seconds()),
        path="/console",
        httponly=True,
        samesite="lax",
        secure=state.secure_cookie or request.url.scheme == "https",
    )
    return response


def signed_out(request: Request, state: pages.ConsoleState, operator: str | None) -> Response:
    """Where sign-out sends the browser: the provider's end-session endpoint for one who signed in through
    it (RP-initiated logout), else the sign-in page."""
    target = "/console/login"
    if state.oidc is not None and operator is not None and operator.startswith("oidc."):
        target = state.oidc.end_session_url(request.cookies.get(ID_TOKEN_COOKIE)) or target
    response = pages.finish(RedirectResponse(target, status_code=303), state, request)
    response.delete_cookie(ID_TOKEN_COOKIE, path="/console", httponly=True, samesite="lax")
    return response
