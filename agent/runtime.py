"""DBOS configuration, launch and shutdown; model selection; the queue refunds run from."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dbos import DBOS, DBOSClient, DBOSConfig
from dbos._dbos import _get_or_create_dbos_registry
from pydantic_ai import Agent
from pydantic_ai.models import Model

from agent.settings import Settings, get_settings
from steps import faults, notify, payments
from steps.store import close_app_database, create_engine, normalize_url, open_app_database

if TYPE_CHECKING:  # imported lazily at run time: runtime is imported by the workflow they feed
    from agent.approvals import ApprovalSettings
    from agent.policy import Limits

log = logging.getLogger(__name__)

APP_NAME = "refund-agent"
REFUND_QUEUE = "refunds"  # durable: enqueued refunds name it


@dataclass
class Runtime:
    settings: Settings
    agent: Agent[Any, Any]
    model_label: str
    limits: Limits
    approvals: ApprovalSettings


_runtime: Runtime | None = None
_agents: dict[str, Agent[Any, Any]] = {}  # one per model per process: DBOS step names are global


def current() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the refund runtime is not started; call runtime.start() first")
    return _runtime


def select_model(settings: Settings) -> tuple[Model | str, str]:
    """The configured model and the label it is shown with (logs, API, audit)."""
    if settings.refund_agent_model_base_url:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        key = settings.refund_agent_model_api_key
        provider = OpenAIProvider(
            base_url=settings.refund_agent_model_base_url,
            api_key=key.get_secret_value() if key else "not-needed",
        )
        name = settings.refund_agent_model or "default"
        return OpenAIChatModel(name, provider=provider), f"{name} at {settings.refund_agent_model_base_url}"
    if settings.refund_agent_model:
        return settings.refund_agent_model, settings.refund_agent_model
    from agent.offline import OFFLINE_MODEL_NAME, offline_model

    return offline_model(), OFFLINE_MODEL_NAME


def dbos_config(settings: Settings) -> DBOSConfig:
    url = normalize_url(settings.system_database_url)
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": url,
        "executor_id": settings.refund_agent_executor_id,
        "application_version": settings.refund_agent_app_version,
        "notification_listener_polling_interval_sec": settings.notification_polling_interval_seconds,
        "log_level": "WARNING",
    }
    if settings.dbos_conductor_key is not None:  # optional: DBOS Console through Conductor
        config["conductor_key"] = settings.dbos_conductor_key.get_secret_value()
    if url.startswith("sqlite"):
        # WAL + synchronous=NORMAL: the same durability for committed steps, far fewer fsyncs.
        config["system_database_engine"] = create_engine(url)
    else:
        config["db_engine_kwargs"] = {"pool_pre_ping": False}
    return config


def migrate_databases(settings: Settings) -> None:
    """Create or migrate both databases: DBOS's system tables and the application schema (Alembic)."""
    from steps.migrate import upgrade

    DBOS.migrate(normalize_url(settings.system_database_url))
    upgrade(settings.app_database_url)


def start(settings: Settings | None = None, *, worker: bool = True, migrate: bool = True) -> Runtime:
    """Configure and launch DBOS in this process; with ``worker``, run refunds from the queue."""
    global _runtime
    from agent import policy
    from agent.approvals import ApprovalSettings
    from agent.brain import build_agent

    settings = settings or get_settings()
    faults.arm(settings.refund_agent_crash_at)
    slack = settings.slack_webhook_url
    notify.configure(notify.NotifyConfig(slack.get_secret_value() if slack else None))
    payments.configure(
        payments.PaymentsConfig(
            base_url=settings.payments_base_url,
            api_key=settings.payments_api_key.get_secret_value(),
            key_ttl_seconds=settings.payments_key_ttl_seconds,
        )
    )
    if migrate:
        migrate_databases(settings)
    model, label = select_model(settings)
    agent = _agents.get(label) or _agents.setdefault(label, build_agent(model))
    importlib.import_module("agent.workflow")  # registers the workflow before launch, for recovery
    DBOS(config=dbos_config(settings))
    open_app_database(settings.app_database_url, durable=True)
    limits = policy.Limits(
        auto_approve=settings.auto_approve_limit,
        absolute_cap=settings.absolute_refund_cap,
        window_days=settings.refund_window_days,
        auto_approve_by_currency=settings.auto_approve_limits,
        absolute_cap_by_currency=settings.absolute_refund_caps,
    )
    approval_settings = ApprovalSettings(
        escalate_after=settings.approval_escalate_after_seconds,
        timeout=settings.approval_timeout_seconds,
        signing_secret=settings.signing_secret(),
        public_url=settings.public_url,
    )
    _runtime = Runtime(settings=settings, agent=agent, model_label=label, limits=limits, approvals=approval_settings)
    if not worker:
        DBOS.listen_queues([])
    DBOS.launch()
    DBOS.register_queue(
        REFUND_QUEUE,
        worker_concurrency=settings.queue_worker_concurrency,
        polling_interval_sec=settings.queue_polling_interval_seconds,
    )
    log.info(
        "refund runtime started: executor=%s version=%s model=%s worker=%s",
        settings.refund_agent_executor_id,
        settings.refund_agent_app_version,
        label,
        worker,
    )
    return _runtime


def stop(workflow_completion_timeout_sec: int = 0) -> None:
    global _runtime
    DBOS.destroy(workflow_completion_timeout_sec=workflow_completion_timeout_sec)
    # DBOS 3.4 keeps the destroyed instance in its registry, where a launched one refuses every datasource
    # made later in this process (the eval harness makes one per run); forget it, as before the first launch.
    _get_or_create_dbos_registry().dbos = None
    close_app_database()
    _runtime = None


def client(settings: Settings | None = None) -> DBOSClient:
    """A DBOS client for processes that submit, approve or inspect without running workflows."""
    settings = settings or get_settings()
    return DBOSClient(system_database_url=normalize_url(settings.system_database_url))
