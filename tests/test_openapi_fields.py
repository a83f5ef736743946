"""Every field a JSON endpoint answers is declared in the OpenAPI document, and every time is RFC 3339 in UTC
with ``Z``: real responses from a real `refund-agent serve` (refunds paid, parked, refused and approved), walked
recursively against the schema ($ref resolved). Plus the API's error wording for bodies it cannot use."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.ops.processes import wait_for
from tests.conftest import Env
from tests.live import LiveService, live_service

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")
#: Where a response may carry keys the schema does not name (a map: its keys are data, not fields).
MAPS = {"/readyz.checks", "/healthz"}


def resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        schema = spec["components"]["schemas"][name]
    return schema


def undeclared(value: Any, schema: dict[str, Any], spec: dict[str, Any], where: str) -> list[str]:
    """The paths of ``value``'s fields that ``schema`` does not declare, and of times not in the API's form."""
    schema = resolve(schema, spec)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        fitting = [resolve(o, spec) for o in options if resolve(o, spec).get("type") != "null"]
        if value is None:
            return []
        objects = [o for o in fitting if o.get("type") == "object" or "properties" in o]
        arrays = [o for o in fitting if o.get("type") == "array"]
        schema = objects[0] if isinstance(value, dict) and objects else arrays[0] if arrays else fitting[0]
    found: list[str] = []
    if (isinstance(value, str) and TIMESTAMP.match(value)) and (
        not value.endswith("Z") or datetime.fromisoformat(value).utcoffset() is None
    ):
        found.append(f"{where} = {value!r} (not RFC 3339 in UTC with Z)")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if not properties and where in MAPS:
            return found
        for key, item in value.items():
            if key in properties:
                found += undeclared(item, properties[key], spec, f"{where}.{key}")
            elif f"{where}.{key}" not in MAPS:
                found.append(f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            found += undeclared(item, schema.get("items", {}), spec, f"{where}[]")
    return found


def response_schema(spec: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    answer = spec["paths"][path][method]["responses"][str(status)]
    schema: dict[str, Any] = answer["content"]["application/json"]["schema"]
    return schema


def check(svc: LiveService, spec: dict[str, Any], method: str, template: str, url: str, **kwargs: Any) -> Any:
    response = svc.http.request(method.upper(), url, **kwargs)
    assert response.status_code < 300, (url, response.text)
    body = response.json()
    schema = response_schema(spec, method, template, response.status_code)
    assert undeclared(body, schema, spec, template) == [], url
    return body


def test_every_field_of_every_json_answer_is_in_the_openapi_schema(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, _):
        spec = svc.http.get("/openapi.json").json()
        parked_ids = {}
        for key, order in (
            ("fields-paid-01", "ord_1001"),
            ("fields-parked-1", "ord_1002"),
            ("fields-refused1", "ord_1007"),
        ):
            accepted = check(
                svc,
                spec,
                "post",
                "/refunds",
                "/refunds",
                json={"order_id": order, "message": "It broke."},
                headers={**svc.auth, "Idempotency-Key": key},
            )
            parked_ids[order] = accepted["refund_id"]
        svc.until("fields-paid-01", "completed")
        svc.until("fields-refused1", "rejected")
        waiting = svc.until("fields-parked-1", "awaiting_approval", headers=svc.approver)
        wait_for(lambda: svc.status("fields-parked-1", svc.approver)["approval"]["deadline"], timeout=30, what="timers")
        for refund_id in ("fields-paid-01", "fields-refused1", "fields-parked-1"):
            check(svc, spec, "get", "/refunds/{refund_id}", f"/refunds/{refund_id}", headers=svc.approver)
        amount = waiting["approval"]["request"]["amount"]
        decided = check(
            svc,
            spec,
            "post",
            "/refunds/{refund_id}/approval",
            "/refunds/fields-parked-1/approval",
            json={"decision": "approve", "amount": amount, "currency": "USD"},
            headers=svc.approver,
        )
        assert decided["decision"] == "approve" and decided["first"] is True
        svc.until("fields-parked-1", "completed", headers=svc.approver)
        approved = check(svc, spec, "get", "/refunds/{refund_id}", "/refunds/fields-parked-1", headers=svc.approver)
        assert approved["approval"]["request"]["amount"] == amount and "requested" not in approved["approval"]
        listing = check(svc, spec, "get", "/refunds", "/refunds?limit=2", headers=svc.approver)
        assert listing["items"] and listing["next_cursor"]
        check(svc, spec, "get", "/refunds", f"/refunds?limit=2&cursor={listing['next_cursor']}", headers=svc.approver)
        check(svc, spec, "get", "/orders", "/orders?limit=3", headers=svc.auth)
        check(svc, spec, "get", "/healthz", "/healthz")
        check(svc, spec, "get", "/readyz", "/readyz")


def test_bodies_the_api_cannot_use_are_answered_in_plain_words(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, _):
        headers = {**svc.auth, "Idempotency-Key": "words-0000001"}
        broken = svc.http.post(
            "/refunds",
            content=b'{"order_id": "ord_1001",\n "message": oops}',
            headers={**headers, "Content-Type": "application/json"},
        )
        assert broken.status_code == 422
        assert broken.json()["detail"] == "the body is not valid JSON: Expecting value at line 2, column 13"
        form = svc.http.post("/refunds", data={"order_id": "ord_1001", "message": "It broke."}, headers=headers)
        assert form.status_code == 415, form.text
        assert "application/json" in form.json()["detail"]
        amount = svc.http.post(
            "/refunds", json={"order_id": "ord_1001", "message": "x", "amount": "4x"}, headers=headers
        )
        assert amount.status_code == 422
        assert amount.json()["detail"] == (
            'amount: amount must be a decimal string such as "42.50": digits, then optionally a point and decimals'
        )
        assert svc.submit("words-0000002", "ord_1001").status_code == 202
        # Who decides which refund is settled first (an unknown refund is 404 whatever the body); then the body.
        decision = svc.http.post("/refunds/words-0000002/approval", data={"decision": "approve"}, headers=svc.approver)
        assert decision.status_code == 415, decision.text
        assert decision.json()["detail"] == "this endpoint takes a body of type application/json"
