"""One error format everywhere (RFC 9457 problem details), and the limits every request meets."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
ACCEPTED_TYPES = ("application/json", "application/x-www-form-urlencoded")
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


def problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status, "detail": detail, **extra}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def _validation_detail(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where}: {item.get('msg', 'invalid')}" if where else str(item.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> Response:
        return problem(exc.status, exc.detail, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        return problem(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        return problem(422, _validation_detail(exc))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return problem(500, "internal error; nothing was changed by the failed part of this request")

    @app.middleware("http")
    async def _limits(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if "\x00" in request.scope["path"] or b"%00" in request.scope["query_string"].lower():
            return problem(400, "NUL characters are not allowed in URLs")
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                return problem(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind not in ACCEPTED_TYPES:
                return problem(415, f"content type must be one of {', '.join(ACCEPTED_TYPES)}")
            body = await request.body()  # cached by Starlette for the endpoint
            if len(body) > MAX_BODY_BYTES:
                return problem(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
        return await call_next(request)
