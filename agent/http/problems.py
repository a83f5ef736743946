"""One error format everywhere (RFC 9457 problem details), and the limits every request meets."""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg
import sqlalchemy.exc
from fastapi import FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from agent.questions import MAX_FILE_BYTES
from steps.store import transient_database_error

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
#: The one place that takes a multipart upload (an image with a customer's answer, agent/http/answers.py), and the
#: largest body it takes: the largest file it keeps and the form around it. Every other path refuses multipart.
UPLOAD_PATH = "/answer/"
MAX_UPLOAD_BODY_BYTES = MAX_FILE_BYTES + MAX_BODY_BYTES
TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    410: "Gone",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    500: "Internal server error",
    503: "Service unavailable",
}


class Problem(Exception):
    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra


def problem(status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status, "detail": detail, **extra}
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


RETRY_AFTER_SECONDS = 1


#: What pydantic puts before a validator's own words ("Value error, amount must be ..."): not for API clients.
_LIBRARY_PREFIX = re.compile(r"^(Value error|Assertion failed), ")
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


def describe(item: Mapping[str, Any]) -> str:
    """One validation error (pydantic's or FastAPI's) in the API's words: ``field: rule``, no library prefix."""
    where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "header", "query", "path"))
    message = _LIBRARY_PREFIX.sub("", str(item.get("msg", "invalid")))
    if item.get("type") == "missing" and tuple(item.get("loc", ())) == ("body",):
        return f"a JSON body is required (Content-Type: {JSON})"
    if item.get("type") == "missing" and item.get("loc", ())[:1] == ("header",):
        return f"the {where} header is required"
    return f"{where}: {message}" if where else message


def _where_in(body: bytes, position: int) -> str:
    """``position`` (a character offset) as line and column, counted from 1."""
    text = body.decode("utf-8", errors="replace")[:position]
    return f"line {text.count(chr(10)) + 1}, column {position - (text.rfind(chr(10)) + 1) + 1}"


def _validation_problem(error: RequestValidationError, body: bytes) -> tuple[int, str]:
    """The status and words for a request FastAPI could not validate: a header (the Idempotency-Key) is a bad
    request (400), as the API always answered a missing key; a body or parameter breaking a rule is 422."""
    items = list(error.errors())
    headers = [item for item in items if item.get("loc", ())[:1] == ("header",)]
    if headers:
        return 400, "; ".join(describe(item) for item in headers[:5])
    for item in items:
        if item.get("type") == "json_invalid":
            loc = item.get("loc", ())
            position = loc[-1] if loc and isinstance(loc[-1], int) else 0
            reason = str((item.get("ctx") or {}).get("error", "not valid JSON"))
            return 422, f"the body is not valid JSON: {reason} at {_where_in(body, position)}"
    return 422, "; ".join(describe(item) for item in items[:5]) or "invalid request"


async def _body(request: Request) -> bytes:
    """The request's body, to place a JSON error; a form the endpoint already read has none to give (b"")."""
    try:
        return await request.body()
    except RuntimeError:  # starlette: "Stream consumed" after form parsing
        return b""


def _wrong_body_type(request: Request) -> str | None:
    """The type of body the route a request reached takes, when the request sent another: a form for routes
    declaring form fields (the approval link's page, the console), JSON for routes declaring a JSON body (the API).
    Routes that read the raw body themselves (Stripe's and Slack's hooks: a signature over the bytes) take any."""
    field = getattr(request.scope.get("route"), "body_field", None)
    if field is None or not _has_body(request):
        return None
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if isinstance(field.field_info, params.File):  # a form with a file: the answer link's (agent/http/answers.py)
        return None if kind in (FORM, MULTIPART) else MULTIPART
    if isinstance(field.field_info, params.Form):
        return None if kind == FORM else FORM
    return None if kind == JSON or kind.endswith("+json") else JSON


def _allowed_methods(request: Request) -> str:
    """The methods a request's path takes (for ``Allow``): each asked of the app's routes."""
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


def _has_body(request: Request) -> bool:
    return request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> Response:
        return problem(exc.status, exc.detail, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the methods of the first route on the path only
            headers["Allow"] = _allowed_methods(request)
            return problem(405, f"{request.method} is not a method of {request.url.path}", headers=headers)
        return problem(exc.status_code, str(exc.detail), headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        if takes := _wrong_body_type(request):
            return problem(415, f"this endpoint takes a body of type {takes}")
        return problem(*_validation_problem(exc, await _body(request)))

    def unavailable(request: Request, transient: str) -> Response:
        log.warning("database unavailable (%s) on %s %s", transient, request.method, request.url.path)
        return problem(
            503,
            f"the database could not finish this request ({transient}); nothing was changed by the failed part "
            "of it, and the same request can be sent again (POST /refunds with the same Idempotency-Key)",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    # Database errors are answered here, not by the catch-all below: Starlette re-raises what reaches the
    # catch-all, and uvicorn then closes the connection a client would send its retry on.
    async def _database(request: Request, exc: Exception) -> Response:
        transient = transient_database_error(exc)
        if transient is not None:
            return unavailable(request, transient)
        log.error("database error %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
        return problem(500, "internal error; nothing was changed by the failed part of this request")

    for database_error in (sqlalchemy.exc.SQLAlchemyError, psycopg.Error, sqlite3.Error):
        app.add_exception_handler(database_error, _database)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        transient = transient_database_error(exc)  # e.g. wrapped by DBOS
        if transient is not None:
            return unavailable(request, transient)
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return problem(500, "internal error; nothing was changed by the failed part of this request")

    @app.middleware("http")
    async def _limits(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if "\x00" in request.scope["path"] or b"%00" in request.scope["query_string"].lower():
            return problem(400, "NUL characters are not allowed in URLs")
        if request.method in ("POST", "PUT", "PATCH"):
            # What each route takes is judged once routing found it (``_wrong_body_type``); multipart, which only
            # the answer link's form takes, is refused anywhere else before anything parses it.
            multipart = request.headers.get("content-type", "").strip().lower().startswith("multipart/")
            upload = multipart and request.scope["path"].startswith(UPLOAD_PATH)
            if multipart and not upload:
                return problem(415, f"no endpoint here takes multipart bodies; the API takes {JSON}")
            limit = MAX_UPLOAD_BODY_BYTES if upload else MAX_BODY_BYTES
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                return problem(413, f"request bodies are limited to {limit} bytes")
            body = await request.body()  # cached by Starlette for the endpoint
            if len(body) > limit:
                return problem(413, f"request bodies are limited to {limit} bytes")
        return await call_next(request)
