"""How console pages are made: templates, security headers, the session cookies, and the POST guard."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup, escape

from agent.console import addresses, auth, sessions
from agent.console.oidc import OidcConfig, Provider
from agent.console.phases import ACTION_LABELS
from agent.settings import ConsoleSettings, Settings
from steps.records import UnsupportedCurrencyError, format_money

log = logging.getLogger(__name__)
templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,  # customers write the messages shown here
    undefined=jinja2.StrictUndefined,
)


def _when(value: str | None) -> str:
    """An ISO timestamp as the console shows times: UTC, to the second."""
    if not value:
        return "-"
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# Direction overrides and zero-width characters can make a customer's text read as something else.
INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _reveal(value: object) -> Markup:
    """Escaped text with its invisible characters shown as [U+XXXX]."""
    escaped = str(escape(value))
    return Markup(INVISIBLE.sub(lambda m: f'<span class="ctl">[U+{ord(m.group()):04X}]</span>', escaped))  # noqa: S704


def _money(amount: object, currency: str | None) -> str:
    """Money the one way the console shows it: thousands separated, the currency's minor units, its code."""
    if amount in (None, "") or not currency:
        return "-"
    try:
        return format_money(Decimal(str(amount)), currency)
    except (InvalidOperation, UnsupportedCurrencyError):
        return f"{amount} {currency}"


def _detail(value: object) -> str:
    """An audit entry's value as a person reads it: no Python reprs (None, True, [...], {...})."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_detail(v) for v in value) or "-"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_detail(v)}" for k, v in value.items()) or "-"
    return str(value)


templates.filters["when"] = _when
templates.filters["reveal"] = _reveal
templates.filters["money"] = _money
templates.filters["detail"] = _detail
templates.globals["action_labels"] = ACTION_LABELS
HEADERS = {
    # No script runs on these pages at all; styles are inline.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass
class ConsoleState:
    operators: Mapping[str, auth.Operator]
    secret: bytes
    """Signs the sign-in form's CSRF cookie and keys the sign-in throttle's name digests."""
    secure_cookie: bool
    trusted_proxies: tuple[addresses.Network, ...] = ()
    generated_admin: bool = False
    """No operator was configured: the one account is ``admin``, its password in the data directory."""
    oidc: Provider | None = None
    """The company's OpenID provider, when configured."""
    password_sign_in: bool = True

    @property
    def oidc_credentials(self) -> str | None:
        return self.oidc.config.credentials if self.oidc is not None else None


def setup(app: FastAPI, settings: Settings) -> None:
    """Load the operators (or make the default admin) and the keys; called in the server's lifespan."""
    operators: Mapping[str, auth.Operator] = auth.parse_operators(settings.approvals.operators)
    if not settings.console.password_sign_in:
        operators = {}  # no password signs anyone in, and sessions started with one end
    elif not operators:
        operators = auth.GeneratedAdmin(settings.console_admin_password())
        log.warning(
            "console: no operators configured; sign in at /console as 'admin' with the password in %s",
            settings.console_admin_password_file(),
        )
    app.state.console = ConsoleState(
        operators,
        settings.session_secret(),
        settings.server.base_url.startswith("https"),
        addresses.networks(settings.server.trusted_proxies),
        generated_admin=settings.console.password_sign_in and not settings.approvals.operators,
        oidc=_provider(settings.console, settings.server.base_url),
        password_sign_in=settings.console.password_sign_in,
    )


def _provider(console: ConsoleSettings, base_url: str) -> Provider | None:
    if console.oidc_issuer_url is None or console.oidc_client_id is None or console.oidc_client_secret is None:
        return None
    base = base_url.rstrip("/")
    config = OidcConfig(
        issuer=console.oidc_issuer_url,
        client_id=console.oidc_client_id,
        client_secret=console.oidc_client_secret.get_secret_value(),
        redirect_uri=f"{base}/console/auth/callback",
        post_logout_uri=f"{base}/console/login",
        scopes=console.oidc_scopes,
        groups_claim=console.oidc_groups_claim,
        role_groups=dict(console.oidc_role_groups),
    )
    return Provider(config)


def _state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


StateDep = Annotated[ConsoleState, Depends(_state)]


def client_address(request: Request, state: ConsoleState) -> str:
    peer = request.client.host if request.client else None
    return addresses.client_address(peer, request.headers.getlist("x-forwarded-for"), state.trusted_proxies)


def session_of(request: Request, state: StateDep) -> auth.Session | None:
    """The signed-in session (checked against its row and the operators configured now), else the sign-in
    form's session, else None."""
    session_id = request.cookies.get(auth.SESSION_COOKIE)
    if session_id:
        address = client_address(request, state)
        signed_in = sessions.current(session_id, state.operators, address, state.oidc_credentials)
        if signed_in is not None:
            return signed_in
        request.state.console_session_ended = True  # the response clears the cookie
    return auth.decode_form_session(request.cookies.get(auth.FORM_COOKIE), state.secret)


SessionDep = Annotated[auth.Session | None, Depends(session_of)]


def _secure(state: ConsoleState, request: Request) -> bool:
    return state.secure_cookie or request.url.scheme == "https"


def finish(
    response: Response, state: ConsoleState, request: Request, form_session: auth.Session | None = None
) -> Response:
    """Security headers; a new sign-in form session's cookie; the cookie of a session that ended, cleared."""
    response.headers.update(HEADERS)
    if state.oidc is not None:  # sign-out's redirect to the provider's end-session endpoint is a form's target
        csp = HEADERS["Content-Security-Policy"]
        origins = " ".join(state.oidc.origins())
        response.headers["Content-Security-Policy"] = csp.replace("form-action 'self'", f"form-action 'self' {origins}")
    if form_session is not None:
        response.set_cookie(
            auth.FORM_COOKIE,
            auth.encode_form_session(form_session, state.secret),
            max_age=auth.FORM_SECONDS,
            path="/console",
            httponly=True,
            samesite="lax",
            secure=_secure(state, request),
        )
    if getattr(request.state, "console_session_ended", False):
        end_session_cookie(response)
    return response


def start_session_cookie(response: Response, state: ConsoleState, request: Request, session_id: str) -> None:
    response.set_cookie(
        auth.SESSION_COOKIE,
        session_id,
        max_age=int(auth.SESSION_LIFETIME.total_seconds()),
        path="/console",
        httponly=True,
        samesite="lax",
        secure=_secure(state, request),
    )
    response.delete_cookie(auth.FORM_COOKIE, path="/console")


def end_session_cookie(response: Response) -> None:
    response.delete_cookie(auth.SESSION_COOKIE, path="/console", httponly=True, samesite="lax")


def render(
    request: Request,
    state: ConsoleState,
    session: auth.Session | None,
    template: str,
    status: int = 200,
    **context: Any,
) -> Response:
    fresh = session is None  # every page carries a CSRF token, so visitors get a sign-in form session
    session = session or auth.new_form_session()
    body = templates.get_template(template).render(session=session, **context)
    return finish(HTMLResponse(body, status_code=status), state, request, session if fresh else None)


def message(
    request: Request, state: ConsoleState, session: auth.Session | None, title: str, text: str, status: int
) -> Response:
    return render(request, state, session, "message.html", status, title=title, text=text)


def to_login(request: Request, state: ConsoleState) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return finish(RedirectResponse(f"/console/login?next={quote(target)}", status_code=303), state, request)


def guard(
    request: Request, state: ConsoleState, session: auth.Session | None, csrf: str | None, role: auth.Role
) -> Response | None:
    """Refuse a POST without a valid session, a matching CSRF token, or the role it needs."""
    if not auth.csrf_ok(session, csrf):
        return message(request, state, session, "Refused", "The form has expired or is not from this console.", 403)
    assert session is not None
    if session.operator is None:
        return message(request, state, session, "Refused", "Sign in first.", 403)
    if not session.may(role):
        return message(request, state, session, "Refused", f"This needs the {role} role.", 403)
    return None
