"""A local Stripe-compatible refunds API (the subset the agent uses) with fault injection.

Serves POST/GET /v1/refunds and GET /v1/charges/{id} with Stripe's idempotency-key semantics (saved
responses, 5xx included), charges that refuse over-refunds, refunds that settle late or fail (also after
succeeding) with signed webhook events, the charges' early fraud warnings and disputes (sandbox/risk.py),
plus /_sandbox admin endpoints.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandbox import risk
from sandbox.evidence_seed import RiskSeed
from sandbox.faults import FAILURE_REASONS, FaultInjector, Faults
from sandbox.ledger import Ledger
from sandbox.ledger_records import Charge, Claimed, Conflict, Refund, Refused, Replay
from sandbox.stripe_api import (
    MAX_AMOUNT,
    CreateParams,
    StripeError,
    form_pairs,
    invalid,
    json_response,
    parse_create,
    parse_list,
    presented_key,
)
from sandbox.webhooks import Settler, WebhookTarget

logger = logging.getLogger(__name__)

DEFAULT_KEY_TTL_SECONDS = 86400.0  # Stripe prunes idempotency keys after 24 hours
#: Stripe's three-decimal currencies: their refunds (and charges) must be whole tens of minor units
#: (docs.stripe.com/currencies, "Three-decimal currencies": 5.124 KWD is sent as 5120 or 5130).
_THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})
_CONFLICTS: dict[str, tuple[int, str, str | None]] = {  # Conflict.reason -> (status, message, code)
    "in_flight": (
        409,
        "Another request with this idempotency key is in progress; retry later.",
        "idempotency_key_in_use",
    ),
    "mismatch": (400, "Keys for idempotent requests can only be reused with the same parameters.", None),
}


@dataclass
class SandboxState:
    """One sandbox app's ledger, faults, webhook target and settings (``app.state.sandbox``). The routes are built
    once per process (``router``) and read the app's own state, so an app costs nothing to build: FastAPI's
    route analysis is about a millisecond a route, and the suite builds a sandbox for every test."""

    ledger: Ledger
    faults: FaultInjector
    target: WebhookTarget
    settler: Settler
    api_key: str | None
    key_ttl_seconds: float
    in_flight_timeout_seconds: float
    clock: Callable[[], float]


def _state(request: Request) -> SandboxState:
    state: SandboxState = request.app.state.sandbox
    return state


State = Annotated[SandboxState, Depends(_state)]


def authenticate(request: Request) -> None:
    presented = presented_key(request)
    if presented is None:
        raise StripeError(401, "invalid_request_error", "You did not provide an API key.")
    api_key = _state(request).api_key
    if api_key is not None and not hmac.compare_digest(presented.encode(), api_key.encode()):
        raise StripeError(401, "invalid_request_error", "Invalid API Key provided.")


#: Every route but the health check needs the API key.
router = APIRouter(dependencies=[Depends(authenticate)])
health = APIRouter()


def create_app(
    *,
    database_url: str,
    api_key: str | None = None,
    key_ttl_seconds: float = DEFAULT_KEY_TTL_SECONDS,
    faults: Faults | None = None,
    in_flight_timeout_seconds: float = 30.0,
    clock: Callable[[], float] = time.time,
    charges: Iterable[Charge] = (),
    webhook_url: str | None = None,
    webhook_secret: str | None = None,
    risk_seed: RiskSeed | None = None,
) -> FastAPI:
    """Build the app; the ledger creates its tables and ``charges`` (and ``risk_seed``'s early fraud warnings and
    disputes, when given) when the app starts (lifespan)."""
    ledger = Ledger(database_url)
    injector = FaultInjector(faults or Faults())
    target = WebhookTarget(webhook_url, webhook_secret)
    settler = Settler(ledger, target, clock=clock)
    seeded = list(charges)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ledger.create_tables()
        ledger.add_charges(seeded)
        if risk_seed is not None:
            risk.replace(ledger, risk_seed)
        settler.start()
        yield
        settler.stop()
        ledger.close()

    app = FastAPI(title="refund-agent sandbox payments", lifespan=lifespan)
    app.state.sandbox = SandboxState(
        ledger, injector, target, settler, api_key, key_ttl_seconds, in_flight_timeout_seconds, clock
    )
    app.state.ledger, app.state.faults, app.state.settler = ledger, injector, settler
    app.include_router(health)
    app.include_router(router)
    app.include_router(risk.router, dependencies=[Depends(authenticate)])
    app.add_exception_handler(StripeError, _stripe_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


async def _stripe_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StripeError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    message = f"Unrecognized request URL ({request.method}: {request.url.path})."
    return StripeError(exc.status_code, "invalid_request_error", message).response()


def no_such(kind: str, object_id: str) -> StripeError:
    """Stripe's 404 for an id it does not know."""
    return StripeError(404, "invalid_request_error", f"No such {kind}: '{object_id}'", "id", "resource_missing")


def resolve_charge(ledger: Ledger, params: CreateParams) -> Charge:
    charge = (
        ledger.get_charge(params.charge)
        if params.charge
        else ledger.charge_of_payment_intent(params.payment_intent or "")
    )
    if charge is None:
        param, value = ("charge", params.charge) if params.charge else ("payment_intent", params.payment_intent)
        raise StripeError(404, "invalid_request_error", f"No such {param}: '{value}'", param, "resource_missing")
    if params.currency is not None and params.currency != charge.currency:
        # Stripe refunds a charge in its own currency; a refund naming another one is refused.
        message = f"The currency {params.currency} does not match the charge's currency {charge.currency}."
        raise invalid(message, "currency")
    if params.amount is not None and charge.currency in _THREE_DECIMAL and params.amount % 10:
        code = charge.currency.upper()
        message = f"Amounts in {code} must be a multiple of 10 minor units: round to the nearest ten."
        raise invalid(message, "amount")
    return charge


@router.post("/v1/refunds")
def create_refund(
    request: Request, sb: State, pairs: Annotated[list[tuple[str, str]], Depends(form_pairs)]
) -> Response:
    ledger, injector = sb.ledger, sb.faults
    if (latency := injector.snapshot().latency_ms) > 0:
        time.sleep(latency / 1000)
    ledger.bump("create_requests")
    params = parse_create(pairs)  # invalid requests never touch the key, as with Stripe
    key = request.headers.get("idempotency-key") or None
    if key is not None and len(key) > 255:
        raise invalid("Idempotency keys can be at most 255 characters long.", "Idempotency-Key")
    charge = resolve_charge(ledger, params)  # validation too: nothing is saved for the key
    echo = {"Idempotency-Key": key} if key else {}
    claim: tuple[str, str] | None = None
    if key is not None:
        ttls = {"ttl_seconds": sb.key_ttl_seconds, "stale_after_seconds": sb.in_flight_timeout_seconds}
        outcome = ledger.claim_key(key, params.fingerprint(), now=sb.clock(), **ttls)
        if isinstance(outcome, Replay):
            ledger.bump("replays")
            return json_response(outcome.status_code, outcome.body, echo | {"Idempotent-Replayed": "true"})
        if isinstance(outcome, Conflict):
            status, message, code = _CONFLICTS[outcome.reason]
            raise StripeError(status, "idempotency_error", message, code=code)
        assert isinstance(outcome, Claimed)
        claim = (key, outcome.token)
    try:
        return execute(sb, params, charge, claim, echo)
    except BaseException:
        if claim is not None:  # nothing committed: do not leave the key stuck in flight
            ledger.release_key(*claim)
        raise


def execute(
    sb: SandboxState, params: CreateParams, charge: Charge, claim: tuple[str, str] | None, echo: dict[str, str]
) -> Response:
    """The endpoint has started executing: from here on Stripe saves its answer for the key, 500s included."""
    ledger, injector = sb.ledger, sb.faults
    fault = injector.decide()
    if fault == "fail":
        error = StripeError(500, "api_error", "Injected failure (sandbox fault); nothing was applied.")
        if claim is not None:
            ledger.save_response(claim, 500, error.body())
        ledger.bump("faults_injected")
        logger.info("sandbox fault: saved a 500 for a refund of %s", charge.id)
        return json_response(500, error.body(), echo)
    lifecycle = injector.lifecycle()
    now = sb.clock()
    settings = injector.snapshot()
    pending = lifecycle != "succeeded"
    refund = Refund(
        id=f"re_{secrets.token_hex(12)}",
        charge=charge.id,
        amount=params.amount if params.amount is not None else max(charge.amount - charge.amount_refunded, 1),
        currency=charge.currency,
        reason=params.reason,
        metadata=params.metadata,
        created=int(now),
        status="pending" if pending else "succeeded",
        settle_at=(now + settings.settle_after_ms / 1000) if pending and settings.settle_after_ms >= 0 else None,
        settle_to=("failed" if lifecycle == "pending_failed" else "succeeded") if pending else None,
        settle_failure_reason=settings.failure_reason if lifecycle == "pending_failed" else None,
    )
    applied = ledger.apply_refund(refund, claim=claim)
    if pending:
        sb.settler.wake()
    if applied is None:
        raise StripeError(409, "idempotency_error", "Idempotency key was taken over; retry.")
    if isinstance(applied, Refused):
        return StripeError(400, "invalid_request_error", applied.message, applied.param, applied.code).response(echo)
    body = json.dumps(applied.to_stripe())
    if fault == "drop":
        ledger.bump("faults_injected")
        logger.info("sandbox fault: applied %s but dropping the response", applied.id)
        raise StripeError(500, "api_error", "Response lost (sandbox fault).")
    return json_response(200, body, echo)


@router.get("/v1/refunds/{refund_id}")
def retrieve_refund(refund_id: str, sb: State) -> Response:
    refund = sb.ledger.get_refund(refund_id)
    if refund is None:
        raise no_such("refund", refund_id)
    return json_response(200, refund.to_stripe())


@router.get("/v1/refunds")
def list_refunds(request: Request, sb: State) -> Response:
    filters = parse_list(request.query_params.multi_items())
    for cursor in ("starting_after", "ending_before"):
        if filters[cursor] is not None and sb.ledger.get_refund(filters[cursor]) is None:
            raise invalid(f"No such refund: '{filters[cursor]}'", cursor, "resource_missing")
    page, has_more = sb.ledger.list_refunds(**filters)
    data = [r.to_stripe() for r in page]
    return json_response(200, {"object": "list", "data": data, "has_more": has_more, "url": "/v1/refunds"})


@router.get("/v1/charges/{charge_id}")
def retrieve_charge(charge_id: str, sb: State) -> Response:
    charge = sb.ledger.get_charge(charge_id)
    if charge is None:
        raise no_such("charge", charge_id)
    return json_response(200, charge.to_stripe())


@health.get("/_sandbox/healthz")
def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/_sandbox/stats")
def stats(sb: State) -> dict[str, int]:
    return sb.ledger.stats()


@router.put("/_sandbox/faults")
def put_faults(new: Faults, sb: State) -> Faults:
    sb.faults.replace(new)
    logger.info("sandbox faults replaced: %s", new)
    return sb.faults.snapshot()


@router.post("/_sandbox/charges")
def post_charges(new: list[NewCharge], sb: State) -> list[dict[str, Any]]:
    """Create charges (an id that exists is left as it is); returns them as stored."""
    made = [Charge(**c.model_dump(), created=int(sb.clock())) for c in new]
    return [c.to_stripe() for c in sb.ledger.add_charges(made)]


@router.post("/_sandbox/refunds/{refund_id}/settle")
def settle_refund(refund_id: str, how: Settlement, sb: State) -> Response:
    """Settle a pending refund now (tests), emitting its event; 409 when it is not pending."""
    if sb.ledger.get_refund(refund_id) is None:
        raise no_such("refund", refund_id)
    if sb.ledger.settle(refund_id, how.status, how.failure_reason, now=sb.clock()) is None:
        raise StripeError(409, "invalid_request_error", f"Refund {refund_id} is not pending.")
    sb.settler.tick()
    return retrieve_refund(refund_id, sb)


@router.post("/_sandbox/refunds/{refund_id}/fail")
def fail_refund(refund_id: str, how: Reversal, sb: State) -> Response:
    """Fail a refund that succeeded (Stripe allows it: the bank returned the money), emitting its signed
    ``refund.failed`` event (tests); 409 when it is not succeeded."""
    if sb.ledger.get_refund(refund_id) is None:
        raise no_such("refund", refund_id)
    if sb.ledger.fail_succeeded(refund_id, how.failure_reason, now=sb.clock()) is None:
        raise StripeError(409, "invalid_request_error", f"Refund {refund_id} has not succeeded.")
    sb.settler.tick()
    return retrieve_refund(refund_id, sb)


@router.put("/_sandbox/webhook")
def put_webhook(new: WebhookSettings, sb: State) -> dict[str, str | None]:
    sb.target.url, sb.target.secret = new.url, new.secret
    sb.settler.wake()
    return {"url": sb.target.url}


@router.get("/_sandbox/events")
def list_events(sb: State) -> list[dict[str, Any]]:
    return sb.ledger.list_events()


class NewCharge(BaseModel):
    id: str = Field(pattern=r"^ch_[A-Za-z0-9_]{1,250}$")
    amount: int = Field(ge=1, le=MAX_AMOUNT)
    currency: str = Field(pattern=r"^[a-z]{3}$")
    amount_refunded: int = Field(default=0, ge=0)
    payment_intent: str | None = Field(default=None, pattern=r"^pi_[A-Za-z0-9_]{1,250}$")


class Settlement(BaseModel):
    status: Literal["succeeded", "failed", "canceled"]
    failure_reason: str | None = None


class Reversal(BaseModel):
    failure_reason: str = "unknown"

    @field_validator("failure_reason")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in FAILURE_REASONS:
            raise ValueError(f"failure_reason must be one of {', '.join(sorted(FAILURE_REASONS))}")
        return value


class WebhookSettings(BaseModel):
    url: str | None = None
    secret: str | None = None


def run_sandbox(
    *,
    host: str,
    port: int,
    database_url: str,
    api_key: str | None,
    key_ttl_seconds: float,
    faults: Faults | None = None,
    charges: Iterable[Charge] = (),
    webhook_url: str | None = None,
    webhook_secret: str | None = None,
    risk_seed: RiskSeed | None = None,
) -> None:
    """Serve the sandbox until interrupted (backs `refund-agent sandbox-payments`)."""
    app = create_app(
        risk_seed=risk_seed,
        database_url=database_url,
        api_key=api_key,
        key_ttl_seconds=key_ttl_seconds,
        faults=faults,
        charges=charges,
        webhook_url=webhook_url,
        webhook_secret=webhook_secret,
    )
    logger.info("sandbox payments on http://%s:%d (%s)", host, port, "key required" if api_key else "any key")
    uvicorn.run(app, host=host, port=port, log_level="info")
