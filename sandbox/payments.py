"""A local Stripe-compatible refunds API (the subset the agent uses) with fault injection.

Serves POST/GET /v1/refunds with Stripe's idempotency-key semantics, plus /_sandbox admin endpoints.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any
from urllib.parse import parse_qsl

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandbox.faults import FaultInjector, Faults
from sandbox.ledger import Claimed, Conflict, Ledger, Refund, Replay

logger = logging.getLogger(__name__)

DEFAULT_KEY_TTL_SECONDS = 86400.0  # Stripe prunes idempotency keys after 24 hours
_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
_METADATA_PARAM = re.compile(r"metadata\[([^\[\]]+)\]")
_MAX_AMOUNT = 99_999_999  # Stripe's 8-digit ceiling for amounts in minor units
_CONFLICTS: dict[str, tuple[int, str, str | None]] = {  # Conflict.reason -> (status, message, code)
    "in_flight": (
        409,
        "Another request with this idempotency key is in progress; retry later.",
        "idempotency_key_in_use",
    ),
    "mismatch": (400, "Keys for idempotent requests can only be reused with the same parameters.", None),
}


@dataclasses.dataclass
class StripeError(Exception):
    """Rendered as Stripe's error envelope: {"error": {"type", "message", "param"?, "code"?}}."""

    status: int
    type: str
    message: str
    param: str | None = None
    code: str | None = None

    def response(self) -> Response:
        error = {"type": self.type, "message": self.message, "param": self.param, "code": self.code}
        return _json(self.status, {"error": {k: v for k, v in error.items() if v is not None}})


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"Request-Id": f"req_{secrets.token_hex(7)}", **(headers or {})}
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def _invalid(message: str, param: str, code: str = "parameter_invalid") -> StripeError:
    return StripeError(400, "invalid_request_error", message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class _CreateParams:
    charge: str
    amount: int
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
            raise _invalid(f"Received unknown parameter: {name}", name, "parameter_unknown")
    return fields, metadata


def _parse_create(pairs: list[tuple[str, str]]) -> _CreateParams:
    fields, metadata = _split_params(pairs, {"charge", "amount", "currency", "reason"})
    for required in ("charge", "amount"):
        if not fields.get(required):
            raise _invalid(f"Missing required param: {required}.", required, "parameter_missing")
    if not re.fullmatch(r"-?[0-9]{1,18}", fields["amount"]):
        raise _invalid(f"Invalid integer: {fields['amount']}", "amount", "parameter_invalid_integer")
    amount = int(fields["amount"])
    if not 1 <= amount <= _MAX_AMOUNT:
        raise _invalid(f"Amount must be between 1 and {_MAX_AMOUNT} (minor units).", "amount")
    currency = fields["currency"].lower() if "currency" in fields else None
    if currency is not None and not re.fullmatch(r"[a-z]{3}", currency):
        raise _invalid(f"Invalid currency: {fields['currency']}", "currency")
    reason = fields.get("reason") or None
    if reason is not None and reason not in _REASONS:
        raise _invalid(f"Invalid reason: must be one of {', '.join(sorted(_REASONS))}", "reason")
    if len(metadata) > 50 or any(len(k) > 40 or len(v) > 500 for k, v in metadata.items()):
        raise _invalid("Metadata allows up to 50 keys of 40 chars with values of 500 chars.", "metadata")
    return _CreateParams(fields["charge"], amount, currency, reason, metadata)


def _presented_key(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":  # some clients send the key as the basic-auth username
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[0] or None
        except ValueError:  # covers binascii.Error and UnicodeDecodeError
            return None
    return None


async def _form_pairs(request: Request) -> list[tuple[str, str]]:
    # Parsed by hand so the service does not need python-multipart for Stripe's form encoding.
    return parse_qsl((await request.body()).decode(errors="replace"), keep_blank_values=True)


def create_app(
    *,
    database_url: str,
    api_key: str | None = None,
    key_ttl_seconds: float = DEFAULT_KEY_TTL_SECONDS,
    faults: Faults | None = None,
    in_flight_timeout_seconds: float = 30.0,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """Build the app; the ledger creates its tables when the app starts (lifespan)."""
    ledger = Ledger(database_url)
    injector = FaultInjector(faults or Faults())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ledger.create_tables()
        yield
        ledger.close()

    app = FastAPI(title="refund-agent sandbox payments", lifespan=lifespan)
    app.state.ledger, app.state.faults = ledger, injector

    def authenticate(request: Request) -> None:
        presented = _presented_key(request)
        if presented is None:
            raise StripeError(401, "invalid_request_error", "You did not provide an API key.")
        if api_key is not None and not hmac.compare_digest(presented.encode(), api_key.encode()):
            raise StripeError(401, "invalid_request_error", "Invalid API Key provided.")

    auth = [Depends(authenticate)]

    @app.post("/v1/refunds", dependencies=auth)
    def create_refund(request: Request, pairs: Annotated[list[tuple[str, str]], Depends(_form_pairs)]) -> Response:
        if (latency := injector.snapshot().latency_ms) > 0:
            time.sleep(latency / 1000)
        ledger.bump("create_requests")
        params = _parse_create(pairs)  # invalid requests never touch the key, as with Stripe
        key = request.headers.get("idempotency-key") or None
        if key is not None and len(key) > 255:
            raise _invalid("Idempotency keys can be at most 255 characters long.", "Idempotency-Key")
        echo = {"Idempotency-Key": key} if key else {}
        claim: tuple[str, str] | None = None
        if key is not None:
            ttls = {"ttl_seconds": key_ttl_seconds, "stale_after_seconds": in_flight_timeout_seconds}
            outcome = ledger.claim_key(key, params.fingerprint(), now=clock(), **ttls)
            if isinstance(outcome, Replay):
                ledger.bump("replays")
                return _json(outcome.status_code, outcome.body, echo | {"Idempotent-Replayed": "true"})
            if isinstance(outcome, Conflict):
                status, message, code = _CONFLICTS[outcome.reason]
                raise StripeError(status, "idempotency_error", message, code=code)
            assert isinstance(outcome, Claimed)
            claim = (key, outcome.token)
        fault = injector.decide()
        if fault == "fail":
            # Stripe saves nothing for requests that failed before executing, so the key is reusable.
            if claim is not None:
                ledger.release_key(*claim)
            ledger.bump("faults_injected")
            logger.info("sandbox fault: injected failure before applying refund for %s", params.charge)
            raise StripeError(500, "api_error", "Injected failure (sandbox fault); nothing was applied.")
        fields = dataclasses.asdict(params) | {"currency": params.currency or "usd", "created": int(clock())}
        refund = Refund(id=f"re_{secrets.token_hex(12)}", **fields)
        body = json.dumps(refund.to_stripe())
        try:
            applied = ledger.apply_refund(refund, claim=claim, response_status=200, response_body=body)
        except BaseException:
            if claim is not None:  # nothing committed: do not leave the key stuck in flight
                ledger.release_key(*claim)
            raise
        if not applied:
            raise StripeError(409, "idempotency_error", "Idempotency key was taken over; retry.")
        if fault == "drop":
            ledger.bump("faults_injected")
            logger.info("sandbox fault: applied %s but dropping the response", refund.id)
            raise StripeError(500, "api_error", "Response lost (sandbox fault).")
        return _json(200, body, echo)

    @app.get("/v1/refunds/{refund_id}", dependencies=auth)
    def retrieve_refund(refund_id: str) -> Response:
        refund = ledger.get_refund(refund_id)
        if refund is None:
            message = f"No such refund: '{refund_id}'"
            raise StripeError(404, "invalid_request_error", message, "id", "resource_missing")
        return _json(200, refund.to_stripe())

    @app.get("/v1/refunds", dependencies=auth)
    def list_refunds(request: Request) -> Response:
        fields, metadata = _split_params(request.query_params.multi_items(), {"charge", "limit", "starting_after"})
        limit_text = fields.get("limit", "10")
        if not re.fullmatch(r"[0-9]{1,3}", limit_text) or not 1 <= int(limit_text) <= 100:
            raise _invalid("limit must be an integer between 1 and 100.", "limit")
        after = fields.get("starting_after")
        if after is not None and ledger.get_refund(after) is None:
            raise _invalid(f"No such refund: '{after}'", "starting_after", "resource_missing")
        page, has_more = ledger.list_refunds(
            charge=fields.get("charge"), metadata_filter=metadata, limit=int(limit_text), starting_after=after
        )
        data = [r.to_stripe() for r in page]
        return _json(200, {"object": "list", "data": data, "has_more": has_more, "url": "/v1/refunds"})

    @app.get("/_sandbox/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/_sandbox/stats", dependencies=auth)
    def stats() -> dict[str, int]:
        return ledger.stats()

    @app.put("/_sandbox/faults", dependencies=auth)
    def put_faults(new: Faults) -> Faults:
        injector.replace(new)
        logger.info("sandbox faults replaced: %s", new)
        return injector.snapshot()

    @app.exception_handler(StripeError)
    async def stripe_error(_request: Request, exc: StripeError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = f"Unrecognized request URL ({request.method}: {request.url.path})."
        return StripeError(exc.status_code, "invalid_request_error", message).response()

    return app


def run_sandbox(
    *,
    host: str,
    port: int,
    database_url: str,
    api_key: str | None,
    key_ttl_seconds: float,
    faults: Faults | None = None,
) -> None:
    """Serve the sandbox until interrupted (backs `refund-agent sandbox-payments`)."""
    app = create_app(database_url=database_url, api_key=api_key, key_ttl_seconds=key_ttl_seconds, faults=faults)
    logger.info("sandbox payments on http://%s:%d (%s)", host, port, "key required" if api_key else "any key")
    uvicorn.run(app, host=host, port=port, log_level="info")
