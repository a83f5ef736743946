"""`refund-agent serve`: the HTTP API with a worker in process, DBOS launched in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent import __version__, console, runtime
from agent.http import answers, api_docs, helpdesk, metrics, openapi, problems, refunds, startup, webhooks
from agent.http import approvals as approval_routes
from agent.http.views import Readiness
from agent.ops.processes import child_env, http_ok, spawn, stop, wait_for
from agent.services import Services
from agent.settings import Settings, get_settings
from sandbox.webhooks import WEBHOOK_SECRET_ENV
from steps import clients
from steps.seed import seed
from steps.store import app_db, orders

log = logging.getLogger(__name__)
_TOKEN_PATH = re.compile(r"/approve/[^?\s\"]+")


class RedactApprovalTokens(logging.Filter):
    """Approval tokens are capabilities: keep them out of access logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_PATH.sub("/approve/<token>", a) if isinstance(a, str) else a for a in record.args
            )
        return True


def _start_sandbox(settings: Settings) -> subprocess.Popen[bytes] | None:
    """Start the payments sandbox unless one already answers on its port (e.g. left by a killed server)."""
    health = f"{settings.payments.base_url}/_sandbox/healthz"
    if http_ok(health):
        return None
    webhook = f"http://{settings.server.host}:{settings.server.port}/webhooks/stripe"
    secret = settings.webhook_secret() or ""
    proc = spawn(
        [
            "sandbox-payments",
            "--port",
            str(settings.payments.sandbox_port),
            "--webhook-url",
            webhook,
        ],
        env=child_env({WEBHOOK_SECRET_ENV: secret}),  # not an argument: arguments show in the process list
        log=settings.database.data_dir / "payments_sandbox.log",
    )
    wait_for(lambda: http_ok(health), timeout=30, what="the payments sandbox")
    log.debug("payments sandbox started on %s (pid %d)", settings.payments.base_url, proc.pid)
    return proc


def _start_evidence_sandbox(settings: Settings) -> subprocess.Popen[bytes] | None:
    """Start the evidence sandbox (carrier, returns, helpdesk) unless one already answers on its port."""
    health = f"{settings.evidence.base_url(None)}/_sandbox/healthz"
    if http_ok(health):
        return None
    proc = spawn(
        ["sandbox-evidence", "--port", str(settings.evidence.sandbox_port)],
        env=child_env({}),
        log=settings.database.data_dir / "evidence_sandbox.log",
    )
    wait_for(lambda: http_ok(health), timeout=30, what="the evidence sandbox")
    log.debug("evidence sandbox started on %s (pid %d)", settings.evidence.base_url(None), proc.pid)
    return proc


def create_app(settings: Settings | None = None, *, worker: bool = True, freeze_heap: bool = True) -> FastAPI:
    """The service's ASGI app; its lifespan starts the runtime (``runtime.start``'s ``worker`` and ``freeze_heap``)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.getLogger("uvicorn.access").addFilter(RedactApprovalTokens())
        with ExitStack() as children:  # a start that fails stops the sandboxes it started, as a stop does
            sandbox = await asyncio.to_thread(_start_sandbox, settings) if settings.payments.uses_sandbox else None
            if sandbox is not None:
                children.callback(stop, sandbox)
            evidence = (
                await asyncio.to_thread(_start_evidence_sandbox, settings) if settings.evidence.uses_sandbox else None
            )
            if evidence is not None:
                children.callback(stop, evidence)
            rt = await asyncio.to_thread(runtime.start, settings, worker=worker, freeze_heap=freeze_heap)
            seeded = 0
            if settings.database.embedded:
                with app_db().engine.connect() as conn:
                    empty = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one() == 0
                if empty:
                    seeded = seed(app_db().engine)
            default_client = clients.ensure_default_client(app_db().engine, settings.api_token())
            if default_client is None:
                log.warning(
                    "the API token is not a live client's key (the client %r was revoked)", clients.DEFAULT_CLIENT
                )
            client = runtime.client(settings)
            from agent.approval_workflows import decide_here

            app.state.services = Services(settings, client, rt.limits, settings.signing_secret(), decide_here)
            prices = settings.model.prices
            app.state.metrics = metrics.api_registry(app_db().engine, client, runtime.QUEUES, prices)
            console.setup(app, settings)
            app.state.startup_facts = startup.StartupFacts(
                worker=worker,
                model_label=rt.model_label,
                seeded_orders=seeded,
                token_generated=settings.server.api_token is None,
                admin_password_file=str(settings.console_admin_password_file())
                if app.state.console.generated_admin
                else None,
            )
            try:
                yield
            finally:
                client.destroy()
                await asyncio.to_thread(runtime.stop, settings.runtime.shutdown_timeout_seconds)

    app = FastAPI(
        title="refund-agent",
        version=__version__,
        description="A durable AI refund agent: submit refunds, follow them, approve them.",
        lifespan=lifespan,
        docs_url=None,  # served by api_docs with local assets
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    openapi.install(app)
    problems.install(app)
    console.install_error_pages(app)  # after the API's handlers: console paths answer errors with pages
    api_docs.install(app)
    app.include_router(refunds.router)
    app.include_router(approval_routes.router)
    app.include_router(answers.router)
    app.include_router(webhooks.router)
    app.include_router(helpdesk.router)
    app.include_router(console.router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        """People who open the service's address land on the console."""
        return RedirectResponse("/console", status_code=303)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, bool]:
        """The process is alive."""
        return {"ok": True}

    @app.get("/metrics", include_in_schema=False, response_model=None)
    def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics (read-only counts; no ids, no amounts). Bearer METRICS_TOKEN when it is set."""
        expected = settings.telemetry.metrics_token
        if expected is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {expected.get_secret_value()}".encode()):
                return problems.problem(401, "metrics need the metrics token")
        body = generate_latest(request.app.state.metrics)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=None,
        responses={200: {"model": Readiness}, **openapi.errors(503, e503="not ready: the problem's `checks` say what")},
    )
    def readyz(request: Request) -> dict[str, Any] | JSONResponse:
        """The databases answer and DBOS is launched."""
        checks: dict[str, bool] = {}
        try:
            with app_db().engine.connect() as conn:
                checks["app_database"] = conn.execute(sa.text("SELECT 1")).scalar_one() == 1
            svc: Services = request.app.state.services
            svc.client.list_workflows(limit=1, load_input=False, load_output=False)
            checks["system_database"] = True
            checks["dbos_launched"] = runtime.current() is not None
        except Exception as error:
            log.warning("not ready: %s", type(error).__name__)
            return problems.problem(503, f"not ready: {type(error).__name__}", checks=checks)
        return {"ok": True, "checks": checks}

    return app


HTTP_SHUTDOWN_TIMEOUT_SECONDS = 5
"""On SIGTERM, how long uvicorn lets open requests finish before it cancels them and the drain of the workflows
(``SHUTDOWN_TIMEOUT_SECONDS``) begins. Without it a client that stalls mid-request holds the process until the
orchestrator's SIGKILL, and the workflows never get their drain. A cancelled submission is retried by its client
with the same Idempotency-Key."""

UVICORN_PROXY_OPTIONS: dict[str, Any] = {"proxy_headers": False}
"""uvicorn would otherwise take the client's address (and scheme) from ``X-Forwarded-For`` whenever the peer
is in its ``forwarded_allow_ips`` (127.0.0.1 by default), so anything connecting from there (a client on the
same host, a proxy passing a client's header along) could claim any address. The console reads that header
itself, from the configured proxies only (``REFUND_AGENT_TRUSTED_PROXIES``)."""


def serve(settings: Settings | None = None, *, worker: bool = True) -> None:
    settings = settings or get_settings()
    # uvicorn re-raises the SIGTERM it handled once it has shut down, so the process would die of the
    # signal after a clean drain; a no-op handler for it to restore makes a graceful stop exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    if settings.telemetry.log_format == "json":
        startup.quiet_uvicorn()
    app = create_app(settings, worker=worker)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=None,  # the levels come from the log config: uvicorn's start-up lines give way to the ready block
        **UVICORN_PROXY_OPTIONS,
        log_config=startup.uvicorn_log_config(settings),
        timeout_graceful_shutdown=HTTP_SHUTDOWN_TIMEOUT_SECONDS,
    )
    # Ctrl-C: uvicorn drains, then re-raises the signal as KeyboardInterrupt; uvicorn.run() ends quietly the same way.
    with contextlib.suppress(KeyboardInterrupt):
        startup.Server(config, app=app, settings=settings).run()
