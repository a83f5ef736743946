"""A local evidence service: carrier tracking (EasyPost-shaped), warehouse returns (ShipBob-shaped) and
earlier helpdesk tickets (Zendesk-shaped), each under the path its real API uses, so each client can be
pointed at the real service by base URL alone. Data is held in memory, loaded from a seed (the format is in
``sandbox/evidence_seed.py``, re-exported here); faults per service (429 with Retry-After, 5xx, slow
answers, a few answers slower than a client waits and then fast ones) and per-service request counters are set
and read under ``/_sandbox``.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from sandbox.evidence_apis import Loaded, add_comment, load, unknown_tracker
from sandbox.evidence_seed import (
    CommentSeed,
    DisputeSeed,
    EvidenceSeed,
    FraudWarningSeed,
    ReturnLineSeed,
    ReturnSeed,
    RiskSeed,
    TicketSeed,
    TrackerSeed,
    TrackingEventSeed,
    When,
    ago,
    ahead,
    utcnow,
)

__all__ = [
    "CommentSeed",
    "DisputeSeed",
    "EvidenceSeed",
    "FraudWarningSeed",
    "ReturnLineSeed",
    "ReturnSeed",
    "RiskSeed",
    "TicketSeed",
    "TrackerSeed",
    "TrackingEventSeed",
    "When",
    "ago",
    "ahead",
]

logger = logging.getLogger(__name__)

Service = Literal["carrier", "returns", "tickets"]
SERVICES: tuple[Service, ...] = ("carrier", "returns", "tickets")
#: Path prefix of each service's API (EasyPost, ShipBob 2026-01, Zendesk).
PREFIXES: dict[Service, str] = {"carrier": "/v2/trackers", "returns": "/2026-01/return", "tickets": "/api/v2/"}
RETURNS_PATH = PREFIXES["returns"]


class ServiceFaults(BaseModel):
    """Faults of one service's API; held per process (``PUT /_sandbox/faults`` replaces them)."""

    model_config = ConfigDict(extra="forbid")

    fail_next: int = Field(default=0, ge=0)
    """The next N requests answer ``status`` (deterministic, checked before the rate)."""
    fail_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    status: int = Field(default=503, ge=429, le=599)
    """429 (with Retry-After) or a 5xx."""
    retry_after_seconds: int | None = Field(default=1, ge=0)
    """Sent as Retry-After with 429 and 503 answers; None: no header."""
    latency_ms: int = Field(default=0, ge=0)
    """Added before every answer (a slow service)."""
    slow_next: int = Field(default=0, ge=0)
    """The next N requests wait ``slow_ms`` more before answering (a service slow for a while, then fast)."""
    slow_ms: int = Field(default=0, ge=0)
    seed: int | None = None


class EvidenceFaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    carrier: ServiceFaults = ServiceFaults()
    returns: ServiceFaults = ServiceFaults()
    tickets: ServiceFaults = ServiceFaults()


class Credentials(BaseModel):
    """What each API accepts; None: any non-empty credential (the local default)."""

    carrier_key: str | None = None
    returns_token: str | None = None
    tickets_email: str | None = None
    tickets_token: str | None = None
    admin_key: str | None = None


class _State:
    def __init__(self, seed: EvidenceSeed, faults: EvidenceFaults) -> None:
        self.lock = threading.Lock()
        self.data: Loaded = load(seed, utcnow())
        self.faults = faults
        self.rngs = {s: random.Random(getattr(faults, s).seed) for s in SERVICES}
        self.stats: dict[str, int] = {s: 0 for s in SERVICES} | {"faults_injected": 0}

    def replace_faults(self, faults: EvidenceFaults) -> None:
        with self.lock:
            self.faults = faults.model_copy(deep=True)
            self.rngs = {s: random.Random(getattr(faults, s).seed) for s in SERVICES}

    def admit(self, service: Service) -> tuple[int, ServiceFaults | None]:
        """Count a request; return its latency and the fault it gets (None: served normally)."""
        with self.lock:
            self.stats[service] += 1
            f: ServiceFaults = getattr(self.faults, service)
            hit = f.fail_next > 0 or (f.fail_rate > 0 and self.rngs[service].random() < f.fail_rate)
            if f.fail_next > 0:
                f.fail_next -= 1
            latency = f.latency_ms
            if f.slow_next > 0:
                f.slow_next -= 1
                latency += f.slow_ms
            if hit:
                self.stats["faults_injected"] += 1
            return latency, f.model_copy() if hit else None


def _service_of(path: str) -> Service | None:
    return next((s for s, prefix in PREFIXES.items() if path.startswith(prefix)), None)


def _basic(request: Request) -> tuple[str, str] | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except ValueError:
        return None
    return user, password


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def _same(presented: str | None, wanted: str | None) -> bool:
    if not presented:
        return False
    return wanted is None or hmac.compare_digest(presented.encode(), wanted.encode())


def _error(service: Service, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """Each API's own error envelope."""
    body: dict[str, Any]
    if service == "carrier":
        body = {"error": {"code": "NOT_FOUND" if status == 404 else f"HTTP.{status}", "message": message}}
    elif service == "returns":
        body = {"title": message, "status": status}
    else:
        body = {"error": "RecordNotFound" if status == 404 else f"HTTP{status}", "description": message}
    return JSONResponse(body, status_code=status, headers=headers)


def _authorized(service: Service, request: Request, creds: Credentials) -> bool:
    if service == "carrier":  # EasyPost: HTTP Basic, the API key as the username
        basic = _basic(request)
        return basic is not None and _same(basic[0], creds.carrier_key)
    if service == "returns":  # ShipBob: a personal access token as a bearer token
        return _same(_bearer(request), creds.returns_token)
    basic = _basic(request)  # Zendesk: HTTP Basic, "<email>/token" and the API token
    if basic is None or not basic[0].endswith("/token"):
        return False
    return _same(basic[0].removesuffix("/token"), creds.tickets_email) and _same(basic[1], creds.tickets_token)


def create_app(
    seed: EvidenceSeed | None = None, *, credentials: Credentials | None = None, faults: EvidenceFaults | None = None
) -> FastAPI:
    """Build the app serving ``seed`` (times fixed now; ``PUT /_sandbox/data`` loads another)."""
    creds = credentials or Credentials()
    state = _State(seed or EvidenceSeed(), faults or EvidenceFaults())
    app = FastAPI(title="refund-agent sandbox evidence")
    app.state.evidence = state

    @app.middleware("http")
    async def faults_and_auth(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        service = _service_of(request.url.path)
        if service is None:
            return await call_next(request)
        latency_ms, fault = state.admit(service)
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        if fault is not None:
            retry = fault.status in (429, 503) and fault.retry_after_seconds is not None
            headers = {"Retry-After": str(fault.retry_after_seconds)} if retry else None
            return _error(service, fault.status, "Injected fault (sandbox).", headers)
        if not _authorized(service, request, creds):
            return _error(service, 401, "Could not authenticate.")
        return await call_next(request)

    # --- carrier: EasyPost trackers ---

    def tracker_for(carrier: str, code: str) -> dict[str, Any]:
        with state.lock:
            found = state.data.trackers.get((carrier.lower(), code))
            return found if found is not None else unknown_tracker(carrier, code, state.data.now)

    @app.post("/v2/trackers")
    def create_tracker(body: TrackerCreate) -> dict[str, Any]:
        return tracker_for(body.tracker.carrier, body.tracker.tracking_code)

    @app.get("/v2/trackers")
    def list_trackers(tracking_code: str = "", carrier: str = "") -> dict[str, Any]:
        with state.lock:
            found = [
                t
                for (c, code), t in state.data.trackers.items()
                if (not tracking_code or code == tracking_code) and (not carrier or c == carrier.lower())
            ]
        return {"trackers": found, "has_more": False}

    @app.get("/v2/trackers/{tracker}")
    def get_tracker(tracker: str) -> Response:
        with state.lock:
            found = next((t for t in state.data.trackers.values() if t["id"] == tracker), None)
        if found is None:
            return _error("carrier", 404, "The requested resource could not be found.")
        return JSONResponse(found)

    # --- returns: ShipBob return orders ---

    @app.get(RETURNS_PATH)
    def list_returns(request: Request) -> dict[str, Any]:
        wanted = {v for ids in request.query_params.getlist("ReferenceIds") for v in ids.split(",") if v}
        with state.lock:
            found = [r for r in state.data.returns if not wanted or r["reference_id"] in wanted]
        return {"items": found, "next": None, "prev": None}

    @app.get(RETURNS_PATH + "/{rma_id}")
    def get_return(rma_id: int) -> Response:
        with state.lock:
            found = next((r for r in state.data.returns if r["id"] == rma_id), None)
        return JSONResponse(found) if found else _error("returns", 404, "Return order not found.")

    # --- tickets: Zendesk search and comments ---

    @app.get("/api/v2/search.json")
    def search(query: str = "") -> dict[str, Any]:
        terms = dict(part.partition(":")[::2] for part in query.split() if ":" in part)
        requester = terms.get("requester", "").strip('"').lower()
        with state.lock:
            users = state.data.users
            results = [
                t
                for t in state.data.tickets
                if terms.get("type", "ticket") == "ticket"
                and (not requester or users[t["requester_id"]]["email"].lower() == requester)
            ]
        return {"results": results, "count": len(results), "next_page": None, "previous_page": None}

    @app.get("/api/v2/tickets/{ticket_id}/comments.json")
    def comments(ticket_id: int, include: str = "") -> Response:
        with state.lock:
            found = state.data.comments.get(ticket_id)
            users = state.data.users
        if found is None:
            return _error("tickets", 404, "Not found")
        body: dict[str, Any] = {"comments": found, "next_page": None, "previous_page": None, "count": len(found)}
        if "users" in include.split(","):
            body["users"] = [users[i] for i in dict.fromkeys(c["author_id"] for c in found)]
        return JSONResponse(body)

    @app.put("/api/v2/tickets/{ticket_id}.json")
    def update_ticket(ticket_id: int, body: TicketUpdate, request: Request) -> Response:
        """Zendesk's ticket update, as far as it adds a comment: public, or an internal note (``public: false``),
        written by the user the API token belongs to; listing the ticket's comments shows it."""
        email = (_basic(request) or ("api/token", ""))[0].removesuffix("/token")
        with state.lock:
            ticket = next((t for t in state.data.tickets if t["id"] == ticket_id), None)
            if ticket is None:
                return _error("tickets", 404, "Not found")
            comment = add_comment(state.data, ticket, email, body.ticket.comment.body, body.ticket.comment.public)
        return JSONResponse({"ticket": ticket, "audit": {"ticket_id": ticket_id, "events": [comment]}})

    # --- admin ---

    def admin(request: Request) -> None:
        if not _same(_bearer(request), creds.admin_key):
            raise _AdminRefused

    guarded = [Depends(admin)]

    @app.get("/_sandbox/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/_sandbox/stats", dependencies=guarded)
    def stats() -> dict[str, int]:
        with state.lock:
            return dict(state.stats)

    @app.put("/_sandbox/faults", dependencies=guarded)
    def put_faults(new: EvidenceFaults) -> EvidenceFaults:
        state.replace_faults(new)
        return new

    @app.put("/_sandbox/data", dependencies=guarded)
    def put_data(new: EvidenceSeed) -> dict[str, int]:
        """Replace everything served; times are fixed from this moment."""
        loaded = load(new, utcnow())
        with state.lock:
            state.data = loaded
        return {"trackers": len(loaded.trackers), "returns": len(loaded.returns), "tickets": len(loaded.tickets)}

    @app.exception_handler(_AdminRefused)
    async def refused(_request: Request, _exc: _AdminRefused) -> Response:
        return JSONResponse({"error": "admin key required"}, status_code=401)

    return app


class _AdminRefused(Exception):
    pass


class _TrackerFields(BaseModel):
    tracking_code: str = Field(min_length=1, max_length=100)
    carrier: str = Field(default="", max_length=50)


class TrackerCreate(BaseModel):
    tracker: _TrackerFields


class _NewComment(BaseModel):
    body: str = Field(min_length=1, max_length=65536)
    public: bool = True


class _TicketChanges(BaseModel):
    comment: _NewComment


class TicketUpdate(BaseModel):
    ticket: _TicketChanges


def run_sandbox(*, host: str, port: int, seed: EvidenceSeed, credentials: Credentials | None = None) -> None:
    """Serve the sandbox until interrupted (backs `refund-agent sandbox-evidence`)."""
    logger.info("sandbox evidence on http://%s:%d (%d trackers)", host, port, len(seed.trackers))
    uvicorn.run(create_app(seed, credentials=credentials), host=host, port=port, log_level="info")
