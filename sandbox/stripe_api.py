"""Stripe's request and error shapes as the payments sandbox speaks them: the API key a request presents, the form
parameters of creating and listing refunds (checked as Stripe checks them), and Stripe's error envelope."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import secrets
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import Response

_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
_METADATA_PARAM = re.compile(r"metadata\[([^\[\]]+)\]")
MAX_AMOUNT = 99_999_999  # Stripe's 8-digit ceiling for amounts in minor units


@dataclasses.dataclass
class StripeError(Exception):
    """Rendered as Stripe's error envelope: {"error": {"type", "message", "param"?, "code"?}}."""

    status: int
    type: str
    message: str
    param: str | None = None
    code: str | None = None

    def body(self) -> str:
        error = {"type": self.type, "message": self.message, "param": self.param, "code": self.code}
        return json.dumps({"error": {k: v for k, v in error.items() if v is not None}})

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return json_response(self.status, self.body(), headers)


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"Request-Id": f"req_{secrets.token_hex(7)}", **(headers or {})}
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def invalid(message: str, param: str, code: str = "parameter_invalid") -> StripeError:
    return StripeError(400, "invalid_request_error", message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class CreateParams:
    charge: str | None
    payment_intent: str | None
    amount: int | None
    currency: str | None
    reason: str | None
    metadata: dict[str, str]

    def fingerprint(self) -> str:
        canonical = json.dumps(["POST /v1/refunds", dataclasses.asdict(self)], sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


def _split_params(pairs: list[tuple[str, str]], allowed: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    fields: dict[str, str] = {}
    metadata: dict[str, str] = {}
    for name, value in pairs:
        if match := _METADATA_PARAM.fullmatch(name):
            metadata[match[1]] = value
        elif name in allowed:
            fields[name] = value
        elif name != "metadata" or value:  # Stripe treats `metadata=` as "no metadata"
            raise invalid(f"Received unknown parameter: {name}", name, "parameter_unknown")
    return fields, metadata


def parse_create(pairs: list[tuple[str, str]]) -> CreateParams:
    fields, metadata = _split_params(pairs, {"charge", "payment_intent", "amount", "currency", "reason"})
    if not fields.get("charge") and not fields.get("payment_intent"):
        raise invalid(
            "One of the following params should be provided for this request: charge or payment_intent.",
            "charge",
            "parameter_missing",
        )
    if fields.get("charge") and fields.get("payment_intent"):
        raise invalid("You cannot specify both charge and payment_intent.", "payment_intent")
    amount: int | None = None
    if "amount" in fields:
        if not re.fullmatch(r"-?[0-9]{1,18}", fields["amount"]):
            raise invalid(f"Invalid integer: {fields['amount']}", "amount", "parameter_invalid_integer")
        amount = int(fields["amount"])
        if not 1 <= amount <= MAX_AMOUNT:
            raise invalid(f"Amount must be between 1 and {MAX_AMOUNT} (minor units).", "amount")
    currency = fields["currency"].lower() if "currency" in fields else None
    if currency is not None and not re.fullmatch(r"[a-z]{3}", currency):
        raise invalid(f"Invalid currency: {fields['currency']}", "currency")
    reason = fields.get("reason") or None
    if reason is not None and reason not in _REASONS:
        raise invalid(f"Invalid reason: must be one of {', '.join(sorted(_REASONS))}", "reason")
    if len(metadata) > 50 or any(len(k) > 40 or len(v) > 500 for k, v in metadata.items()):
        raise invalid("Metadata allows up to 50 keys of 40 chars with values of 500 chars.", "metadata")
    return CreateParams(
        fields.get("charge") or None, fields.get("payment_intent") or None, amount, currency, reason, metadata
    )


_CREATED = re.compile(r"created(?:\[(gt|gte|lt|lte)\])?")


def parse_list(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Stripe's filters for GET /v1/refunds: charge, payment_intent, created, and cursors; nothing else."""
    fields: dict[str, str] = {}
    created: dict[str, int] = {}
    for name, value in pairs:
        if match := _CREATED.fullmatch(name):
            if not re.fullmatch(r"[0-9]{1,12}", value):
                raise invalid(f"Invalid integer: {value}", name, "parameter_invalid_integer")
            created[match[1] or "eq"] = int(value)
        elif name in ("charge", "payment_intent", "limit", "starting_after", "ending_before") or name == "expand[]":
            fields[name] = value
        else:
            raise invalid(f"Received unknown parameter: {name}", name, "parameter_unknown")
    limit_text = fields.get("limit", "10")
    if not re.fullmatch(r"[0-9]{1,3}", limit_text) or not 1 <= int(limit_text) <= 100:
        raise invalid("limit must be an integer between 1 and 100.", "limit")
    return {
        "charge": fields.get("charge"),
        "payment_intent": fields.get("payment_intent"),
        "created": created,
        "limit": int(limit_text),
        "starting_after": fields.get("starting_after"),
        "ending_before": fields.get("ending_before"),
    }


def presented_key(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":  # some clients send the key as the basic-auth username
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[0] or None
        except ValueError:  # covers binascii.Error and UnicodeDecodeError
            return None
    return None


async def form_pairs(request: Request) -> list[tuple[str, str]]:
    # Parsed by hand so the service does not need python-multipart for Stripe's form encoding.
    return parse_qsl((await request.body()).decode(errors="replace"), keep_blank_values=True)
