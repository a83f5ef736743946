"""The OpenAPI document says what a client must know: how to authenticate (the Authorize button of /docs), that
``Idempotency-Key`` is required, and every status the README documents for ``POST /refunds``, each error as a
problem document. Read from the app itself (building it starts nothing)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent.http.server import create_app
from agent.settings import Settings

README = Path(__file__).parent.parent / "README.md"
PROBLEM = {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
#: The operations a client calls with its key; the link, Slack, Stripe and health routes carry their own proof.
KEYED = [
    ("post", "/refunds"),
    ("get", "/refunds"),
    ("get", "/refunds/{refund_id}"),
    ("get", "/orders"),
    ("post", "/refunds/{refund_id}/approval"),
]
OWN_PROOF = [
    ("get", "/approve/{token}"),
    ("post", "/approve/{token}"),
    ("get", "/answer/{refund_id}/{token}"),
    ("post", "/answer/{refund_id}/{token}"),
    ("post", "/slack/interactions"),
    ("post", "/webhooks/stripe"),
    ("get", "/healthz"),
    ("get", "/readyz"),
]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def readme_statuses() -> set[str]:
    """The statuses the README's table of `POST /refunds` answers lists (plus 202 and 200 it states in words)."""
    text = README.read_text()
    section = text[text.index("What `POST /refunds` accepts") :]
    section = section[: section.index("\n## ")]
    return set(re.findall(r"^\| (\d{3}) \|", section, flags=re.MULTILINE)) | {"200", "202"}


def test_the_document_declares_the_bearer_key_and_which_operations_need_it(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert [(s["type"], s["scheme"]) for s in schemes.values()] == [("http", "bearer")]
    (name,) = schemes
    for method, path in KEYED:
        operation = document["paths"][path][method]
        assert operation.get("security") == [{name: []}], (method, path)
        assert "Authorization" not in [p["name"] for p in operation.get("parameters", [])], (method, path)
    for method, path in OWN_PROOF:
        assert "security" not in document["paths"][path][method], (method, path)


def test_the_idempotency_key_is_a_required_header(document: dict[str, Any]) -> None:
    parameters = document["paths"]["/refunds"]["post"]["parameters"]
    key = next(p for p in parameters if p["name"] == "Idempotency-Key")
    assert key["in"] == "header" and key["required"] is True
    assert "400" in key["description"]


def test_post_refunds_lists_every_status_the_readme_documents(document: dict[str, Any]) -> None:
    documented = readme_statuses()
    assert len(documented) >= 11, documented  # the table read: 400 ... 503, with 200 and 202
    responses = document["paths"]["/refunds"]["post"]["responses"]
    assert documented <= set(responses), documented - set(responses)
    for status in ("200", "202"):
        assert responses[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Accepted"}


@pytest.mark.parametrize(("method", "path"), KEYED)
def test_every_error_is_a_problem_document(document: dict[str, Any], method: str, path: str) -> None:
    responses = document["paths"][path][method]["responses"]
    errors = {status: answer for status, answer in responses.items() if status >= "400"}
    assert {"401", "403", "503"} <= set(errors), (method, path, sorted(errors))
    for status, answer in errors.items():
        assert answer["content"] == {"application/problem+json": PROBLEM}, (method, path, status)
        assert answer["description"], (method, path, status)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    problem = document["components"]["schemas"]["ProblemDetails"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}


def test_the_approval_operation_lists_unknown_refunds_and_closed_windows(document: dict[str, Any]) -> None:
    responses = document["paths"]["/refunds/{refund_id}/approval"]["post"]["responses"]
    assert {"200", "404", "409", "410", "422"} <= set(responses)
    assert "no refund" in responses["404"]["description"]


def test_operation_ids_are_the_endpoints_names(document: dict[str, Any]) -> None:
    """What a generated client calls its functions (``create_refund``, not ``create_refund_refunds_post``)."""
    ids = {document["paths"][path][method]["operationId"] for method, path in KEYED}
    assert ids == {"create_refund", "list_refunds", "get_refund", "get_orders", "post_decision"}


@pytest.mark.parametrize(
    ("path", "statuses"), [("/slack/interactions", {"400", "401", "409"}), ("/webhooks/stripe", {"401"})]
)
def test_the_hooks_declare_their_refusals_as_problems(document: dict[str, Any], path: str, statuses: set[str]) -> None:
    responses = document["paths"][path]["post"]["responses"]
    assert statuses <= set(responses), sorted(responses)
    assert all(responses[status]["content"] == {"application/problem+json": PROBLEM} for status in statuses)
