"""What the OpenAPI document says beyond each route's own types: how a client authenticates, and the problem
document (RFC 9457) every error is, with the statuses each route can answer. A client generated from the
document (``openapi-python-client``, tests/test_generated_client.py) submits and reads refunds with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

PROBLEM_TYPE = "application/problem+json"

#: The API clients' keys (``refund-agent clients add``): ``Authorization: Bearer <key>``; the Authorize button of
#: /docs. ``auto_error=False``: a missing or wrong key is answered by ``agent.http.clients`` as a problem (401).
bearer = HTTPBearer(
    scheme_name="ApiKey",
    bearerFormat="API client key",
    description="The key of an API client (`refund-agent clients add`); the service's own token is the client "
    "`default`. Sent as `Authorization: Bearer <key>`.",
    auto_error=False,
)


class ProblemDetails(BaseModel):
    """An error, as RFC 9457 problem details: ``detail`` says in plain words what was wrong and what to do."""

    model_config = ConfigDict(extra="allow")  # a few problems carry more (a decision's ``recorded``, ``checks``)

    type: str = Field(examples=["about:blank"])
    title: str = Field(examples=["Unprocessable content"])
    status: int = Field(examples=[422])
    detail: str = Field(examples=['amount: amount has 3 decimal places; at most 2 ("42.50")'])


#: What each status means wherever it is answered; a route may say more about its own.
WHEN = {
    400: "a header or query parameter that is missing or malformed",
    401: "no live API client's key (`Authorization: Bearer <key>`)",
    403: "the client lacks the scope this needs",
    404: "nothing with that id (or not one this client may read)",
    409: "conflicts with what was recorded before",
    410: "too late: the approval window has closed",
    413: "a body over 64 KiB",
    415: "a body that is not `application/json`",
    422: "a body or parameter that breaks a rule, said in plain words",
    503: "the database blipped: nothing was changed, the same request can be sent again (`Retry-After`)",
}
#: What every route behind an API key can answer besides its own errors.
GUARDED = (401, 403, 503)


def errors(*statuses: int, **said: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status a problem document, described by ``said["e404"]`` or ``WHEN``."""
    return {
        status: {"model": ProblemDetails, "description": said.get(f"e{status}", WHEN[status])}
        for status in sorted(statuses)
    }


def operation_id(route: APIRoute) -> str:
    """Operation ids are the endpoint's name (``create_refund``): what a generated client calls its functions."""
    return route.name


def _problem_answers(document: dict[str, Any]) -> None:
    """Errors are ``application/problem+json`` with ``ProblemDetails``, not FastAPI's 422 ``HTTPValidationError``
    (the API never answers that shape: agent/http/problems.py turns validation errors into problems)."""
    problem = {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for status, answer in operation.get("responses", {}).items():
                if status[:1] in ("4", "5") and "application/json" in answer.get("content", {}):
                    answer["content"] = {PROBLEM_TYPE: problem}
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas.setdefault("ProblemDetails", ProblemDetails.model_json_schema())


def install(app: FastAPI) -> None:
    """Build the document once, with problems in place of FastAPI's validation errors."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            _problem_answers(build())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
