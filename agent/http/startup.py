"""What `refund-agent serve` says once it is up: where things are, never the secrets themselves."""

from __future__ import annotations

import copy
import logging
import sys
from dataclasses import dataclass
from typing import Any

import uvicorn

from agent.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartupFacts:
    """What the lifespan learnt while starting, for the ready block."""

    worker: bool
    model_label: str
    seeded_orders: int
    """Demo orders loaded at this start (0: the database had orders already, or is not the embedded one)."""
    token_generated: bool
    """The API token was generated into the data directory (not set in the environment)."""
    admin_password_file: str | None
    """Where the generated console admin's password is, when no operator is configured."""


def ready_lines(settings: Settings, facts: StartupFacts) -> list[str]:
    base = f"http://{settings.server.host}:{settings.server.port}"
    role = "API + worker" if facts.worker else "API only (workers run refunds)"
    token_at = f"in {settings.api_token_file()}" if facts.token_generated else "REFUND_AGENT_API_TOKEN (environment)"
    if facts.admin_password_file is not None:
        console = f"{base}/console  (sign in as 'admin', password in {facts.admin_password_file})"
    else:
        console = f"{base}/console  (operators from REFUND_AGENT_OPERATORS or single sign-on)"
    lines = [
        f"refund-agent ready: {role}, model: {facts.model_label}",
        f"  API          {base}",
        f"  console      {console}",
        f"  API docs     {base}/docs",
        f"  API token    {token_at}",
        f"  email        {settings.email.summary()}",
    ]
    if settings.helpdesk.enabled:
        tickets = settings.evidence.base_url(settings.evidence.tickets_api_base)
        lines.append(
            f"  help desk    {base}/webhooks/helpdesk as client:{settings.helpdesk.principal}; replies to {tickets}"
        )
    if facts.seeded_orders:
        lines.append(f"  demo orders  {facts.seeded_orders} seeded (ord_1001 ...), with their customers")
    return lines


class Server(uvicorn.Server):
    """uvicorn's server, saying where everything is once it listens (the lifespan has run by then)."""

    def __init__(self, config: uvicorn.Config, *, app: Any, settings: Settings) -> None:
        super().__init__(config)
        self.app, self.settings = app, settings

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        facts: StartupFacts | None = getattr(self.app.state, "startup_facts", None)
        if self.started and facts is not None:
            announce(ready_lines(self.settings, facts), json=self.settings.telemetry.log_format == "json")

    async def shutdown(self, sockets: Any = None) -> None:
        """Say that it stops and what it waits for, then that it stopped (uvicorn's own lines are quiet)."""
        facts: StartupFacts | None = getattr(self.app.state, "startup_facts", None)
        as_json = self.settings.telemetry.log_format == "json"
        announce([stopping_line(self.settings, worker=facts is not None and facts.worker)], json=as_json)
        await super().shutdown(sockets)
        announce(["refund-agent stopped"], json=as_json)


def stopping_line(settings: Settings, *, worker: bool) -> str:
    waits = f"; refunds in flight get {settings.runtime.shutdown_timeout_seconds}s to finish" if worker else ""
    return f"refund-agent stopping: no new requests{waits}"


def announce(lines: list[str], *, json: bool) -> None:
    if json:
        log.info("; ".join(line.strip() for line in lines))
    else:
        print("\n".join(lines), file=sys.stdout, flush=True)


def uvicorn_log_config(settings: Settings) -> dict[str, Any] | None:
    """uvicorn's logging, without its start-up chatter (process started, waiting, complete, running on):
    the ready block says it. Its warnings and errors, and the access log, stay."""
    if settings.telemetry.log_format == "json":
        return None  # its loggers propagate to the root handler (agent.ops.logs); levels set in quiet_uvicorn
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["uvicorn.error"] = {"level": "WARNING"}
    config["loggers"]["uvicorn.access"]["level"] = "INFO"
    return config


def quiet_uvicorn() -> None:
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO)
