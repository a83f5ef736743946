"""Errors under /console as HTML pages in the console's layout; every other path keeps problem+json.

``install_error_pages(app)`` wraps the exception handlers the app already has (``agent.http.problems``), so
it runs after them: the API's answers do not change, and a console page gets the same status as a page."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agent.console import pages

log = logging.getLogger(__name__)
Handler = Callable[[Request, Any], Response | Awaitable[Response]]
TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Page not found",
    405: "Not here",
    409: "Not done",
    413: "Too large",
    422: "Not understood",
    500: "Something went wrong",
    503: "Busy, try again",
}
TEXTS = {
    404: "There is no console page at this address.",
    405: "This address does not take that kind of request (a form's button, not a link, posts here).",
    500: "The console could not show this page. Nothing was changed by the part that failed; try again.",
}


def console_path(request: Request) -> bool:
    path = request.url.path
    return path == "/console" or path.startswith("/console/")


def _detail(response: Response) -> str:
    try:
        body = json.loads(bytes(response.body))
    except ValueError:
        return ""
    return str(body.get("detail", "")) if isinstance(body, dict) else ""


def _page(request: Request, response: Response) -> Response:
    status = response.status_code
    state = request.app.state.console
    session = None
    if status < 500:  # a 500 may come from the database the session lives in: the page goes without it
        try:
            session = pages.session_of(request, state)
        except Exception:  # the error page shows even when the session cannot be read
            log.warning("console error page %s on %s without its session", status, request.url.path)
    text = TEXTS.get(status) or _detail(response) or "The console could not do that."
    title = TITLES.get(status, "Error")
    page = pages.render(request, state, session, "error.html", status, code=status, title=title, text=text)
    for name in ("retry-after", "allow"):
        if name in response.headers:
            page.headers[name] = response.headers[name]
    return page


def _wrapped(handler: Handler) -> Handler:
    async def handle(request: Request, exc: Any) -> Response:
        response = handler(request, exc)
        if not isinstance(response, Response):
            response = await response
        if console_path(request) and response.media_type == "application/problem+json":
            return _page(request, response)
        return response

    return handle


def install_error_pages(app: FastAPI) -> None:
    """Answer the errors of console paths with pages; call after the app's own handlers are installed."""
    for key, handler in list(app.exception_handlers.items()):
        app.exception_handlers[key] = _wrapped(handler)
