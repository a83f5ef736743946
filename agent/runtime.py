"""DBOS configuration, launch and shutdown; model selection; the queue refunds run from."""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig
from pydantic import SecretStr
from pydantic_ai import Agent
from pydantic_ai.models import Model

# The workflow modules are imported here so DBOS registers them before launch (recovery needs them);
# they reach the running agent through agent.context, never through this module.
from agent import approval_workflows, legacy, policy, question_workflows, rejudge, workflow
from agent.approvals import APPROVAL_QUEUE, ApprovalSettings
from agent.brain import build_agent
from agent.context import Runtime, current, install, running
from agent.identity import approver_names
from agent.model_calls import ModelCalls
from agent.ops import heartbeat
from agent.ops.checkpoint_store import secure_checkpoints
from agent.ops.checkpoints import SERIALIZER
from agent.ops.delivery import DeliveryLoop
from agent.settings import EvidenceSettings, ModelProviderSettings, PaymentSettings, Settings, get_settings
from steps import audit, evidence_http, faults, helpdesk, mail, notify, payments
from steps.store import close_app_database, create_engine, normalize_url, open_app_database

log = logging.getLogger(__name__)

#: Every module that defines a DBOS workflow: importing them registers the workflows, which must happen before
#: ``DBOS.launch()`` so recovery finds them.
WORKFLOW_MODULES = (workflow, legacy, approval_workflows, question_workflows, rejudge)

__all__ = [
    "QUEUES",
    "REFUND_QUEUE",
    "WORKFLOW_MODULES",
    "Runtime",
    "client",
    "current",
    "dbos_config",
    "select_model",
    "start",
    "stop",
]

APP_NAME = "refund-agent"
REFUND_QUEUE = workflow.REFUND_QUEUE
QUEUES = (REFUND_QUEUE, APPROVAL_QUEUE)  # a worker runs both; an API-only process neither


#: One per model (and retry policy) per process: DBOS step names are global.
_agents: dict[tuple[str, ModelCalls], Agent[Any, Any]] = {}


def select_model(settings: ModelProviderSettings) -> tuple[Model | str, str]:
    """The configured model (with its fallback, if one is set) and the label it is shown with (logs, API, audit)."""
    model, label = _model(settings.name, settings.base_url, settings.api_key)
    if model is None:
        from agent.offline import OFFLINE_MODEL_NAME, offline_model

        model, label = offline_model(), OFFLINE_MODEL_NAME
    if not (settings.fallback or settings.fallback_base_url):
        return model, label
    from pydantic_ai.models.fallback import FallbackModel

    fallback, fallback_label = _model(settings.fallback, settings.fallback_base_url, settings.fallback_api_key)
    assert fallback is not None
    # Within one model request step: the first model, then the fallback on any provider error (the step retries
    # both while the failure is transient).
    return FallbackModel(model, fallback), f"{label} (fallback: {fallback_label})"


def _model(name: str | None, base_url: str | None, key: SecretStr | None) -> tuple[Model | str | None, str]:
    """A model string as given, or the named model of an OpenAI-compatible server; None when neither is set."""
    if base_url:
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        # No retries in the client: the model request step retries (agent/model_calls.py), one policy for all.
        client = AsyncOpenAI(base_url=base_url, api_key=key.get_secret_value() if key else "not-needed", max_retries=0)
        name = name or "default"
        return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client)), f"{name} at {base_url}"
    return name, name or ""


def model_calls(settings: ModelProviderSettings) -> ModelCalls:
    """How model requests are retried, timed out and limited per refund."""
    return ModelCalls(
        attempts=settings.attempts,
        interval_seconds=settings.retry_interval_seconds,
        backoff_rate=settings.backoff_rate,
        timeout_seconds=settings.timeout_seconds,
        request_limit=settings.request_limit,
        token_limit=settings.token_limit,
    )


EXIT_LEASE_LOST = 75  # EX_TEMPFAIL: another process owns our executor id now; the supervisor restarts us


def dbos_config(settings: Settings) -> DBOSConfig:
    url = normalize_url(settings.database.system_database_url)
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": url,
        "executor_id": settings.runtime.executor_id,
        "application_version": settings.runtime.app_version,
        "notification_listener_polling_interval_sec": settings.runtime.notification_polling_interval_seconds,
        "log_level": "WARNING",
        "serializer": SERIALIZER,  # checkpoints as JSON, never pickle (agent/ops/checkpoints.py)
    }
    if settings.runtime.conductor_key is not None:  # optional: DBOS Console through Conductor
        config["conductor_key"] = settings.runtime.conductor_key.get_secret_value()
    if url.startswith("sqlite"):
        # WAL + synchronous=NORMAL: the same durability for committed steps, far fewer fsyncs.
        config["system_database_engine"] = create_engine(url)
    else:
        config["db_engine_kwargs"] = {"pool_pre_ping": False}
    if settings.telemetry.otlp_traces_endpoint or settings.telemetry.otlp_logs_endpoint:
        config["enable_otlp"] = True
        telemetry = settings.telemetry
        config["otlp_traces_endpoints"] = [telemetry.otlp_traces_endpoint] if telemetry.otlp_traces_endpoint else []
        config["otlp_logs_endpoints"] = [telemetry.otlp_logs_endpoint] if telemetry.otlp_logs_endpoint else []
        config["otlp_attributes"] = {"refund_agent.executor_id": settings.runtime.executor_id}
    return config


def evidence_config(evidence: EvidenceSettings, payments: PaymentSettings) -> evidence_http.EvidenceConfig:
    """Where the evidence steps look (an unset base URL: the local evidence sandbox) and with which keys."""
    return evidence_http.EvidenceConfig(
        carrier_base_url=evidence.base_url(evidence.carrier_api_base),
        carrier_api_key=evidence.carrier_api_key.get_secret_value(),
        returns_base_url=evidence.base_url(evidence.returns_api_base),
        returns_api_key=evidence.returns_api_key.get_secret_value(),
        tickets_base_url=evidence.base_url(evidence.tickets_api_base),
        tickets_email=evidence.tickets_api_email,
        tickets_api_token=evidence.tickets_api_token.get_secret_value(),
        stripe_base_url=payments.base_url,
        stripe_api_key=payments.api_key.get_secret_value(),
        attempts=evidence.attempts,
        timeout_seconds=evidence.timeout_seconds,
    )


def use_audit_chain(settings: Settings) -> None:
    """Append to and check the audit chain with the settings' key, anchored in this host's data directory."""
    audit.use_key(settings.audit_key())
    audit.use_anchor(settings.audit_anchor_file(), unkeyed_allowed=settings.audit.unkeyed_entries)


def migrate_databases(settings: Settings) -> None:
    """Create or migrate both databases: DBOS's system tables (with pickled checkpoints rewritten as JSON) and the
    application schema (Alembic)."""
    from steps.migrate import upgrade

    url = normalize_url(settings.database.system_database_url)
    DBOS.migrate(url)
    engine = create_engine(url)
    try:
        secure_checkpoints(engine)
    finally:
        engine.dispose()
    upgrade(settings.database.app_database_url)


def start(
    settings: Settings | None = None, *, worker: bool = True, migrate: bool = True, freeze_heap: bool = True
) -> Runtime:
    """Configure and launch DBOS in this process; with ``worker``, run refunds from the queue.

    ``freeze_heap``: keep start-up's objects out of full garbage collections (see ``_freeze_startup_heap``), right
    for a process that runs the service until it exits; a host that starts and stops runtimes again and again
    in one process (a test session) passes False, since each start would otherwise walk its whole heap once.
    """
    settings = settings or get_settings()
    faults.arm(settings.runtime.crash_at)
    use_audit_chain(settings)  # every step that writes the book appends to the audit chain
    slack = settings.channels.slack_webhook_url
    notify.configure(notify.NotifyConfig(slack.get_secret_value() if slack else None))
    payments.configure(
        payments.PaymentsConfig(
            base_url=settings.payments.base_url,
            api_key=settings.payments.api_key.get_secret_value(),
            key_ttl_seconds=settings.payments.key_ttl_seconds,
        )
    )
    evidence_http.configure(evidence_config(settings.evidence, settings.payments))
    if migrate:
        migrate_databases(settings)
    if settings.telemetry.otlp_traces_endpoint:
        # Agent runs, model requests and tool calls as spans, under DBOS's workflow and step spans (DBOS
        # installs the tracer provider from the same endpoint). Content stays out: messages are customers'.
        from pydantic_ai import InstrumentationSettings

        Agent.instrument_all(InstrumentationSettings(include_content=False, include_binary_content=False))
    model, label = select_model(settings.model)
    calls = model_calls(settings.model)
    agent = _agents.get((label, calls)) or _agents.setdefault((label, calls), build_agent(model, calls=calls))
    lease_engine = heartbeat.lease_engine(settings.database.app_database_url)
    lease = heartbeat.claim(
        lease_engine,
        executor_id=settings.runtime.executor_id if settings.runtime.executor_id_pinned else None,
        app_version=settings.runtime.app_version,
        role="worker" if worker else "api",
        stale_after=settings.runtime.executor_stale_after_seconds,
    )
    settings = settings.with_values(refund_agent_executor_id=lease.executor_id)
    try:
        DBOS(config=dbos_config(settings))
    except BaseException:
        heartbeat.release_quietly(lease_engine, lease)
        lease_engine.dispose()
        raise
    open_app_database(settings.database.app_database_url, durable=True)
    limits = policy.Limits(
        auto_approve=settings.policy.auto_approve_limit,
        absolute_cap=settings.policy.absolute_refund_cap,
        window_days=settings.policy.refund_window_days,
        auto_approve_by_currency=settings.policy.auto_approve_limits,
        absolute_cap_by_currency=settings.policy.absolute_refund_caps,
        customer_window_days=settings.policy.customer_refund_window_days,
        customer_max_refunds=settings.policy.customer_max_refunds,
        customer_max_amount=settings.policy.customer_max_refund_amount,
        customer_max_amount_by_currency=settings.policy.customer_max_refund_amounts,
        order_max_open_claims=settings.policy.order_max_open_claims,
        scales=settings.policy.limit_scales,
        questions=settings.questions.enabled,
    )
    approval_settings = ApprovalSettings(
        escalate_after=settings.approvals.escalate_after_seconds,
        timeout=settings.approvals.timeout_seconds,
        signing_secret=settings.signing_secret(),
        public_url=settings.server.base_url,
        approvers=approver_names(settings.approvals.operators),
    )
    beat = heartbeat.Heartbeat(
        lease_engine,
        lease,
        interval=settings.runtime.executor_heartbeat_seconds,
        stale_after=settings.runtime.executor_stale_after_seconds,
        on_lost=_lease_lost,
        fallback_queue=APPROVAL_QUEUE,
    )
    rt = Runtime(
        settings=settings,
        agent=agent,
        model_label=label,
        usage_limits=calls.usage_limits(),
        limits=limits,
        approvals=approval_settings,
        lease=lease,
        heartbeat=beat,
    )
    install(rt)
    if not worker:
        DBOS.listen_queues([])
    if freeze_heap:
        _freeze_startup_heap()
    DBOS.launch()
    # Stored in the system database: the last process of the latest version started sets them for all.
    rate = settings.runtime.queue_rate_limit_per_minute
    DBOS.register_queue(
        REFUND_QUEUE,
        worker_concurrency=settings.runtime.queue_worker_concurrency,
        limiter={"limit": rate, "period": 60.0} if rate is not None else None,
        polling_interval_sec=settings.runtime.queue_polling_interval_seconds,
    )
    # Decisions, deadlines and continuations: their own slots, so a backlog of new refunds never delays an
    # approved payment, and 10,000 deadlines falling due at once never stop new refunds from starting.
    DBOS.register_queue(
        APPROVAL_QUEUE,
        worker_concurrency=settings.runtime.approval_queue_worker_concurrency,
        polling_interval_sec=settings.runtime.queue_polling_interval_seconds,
    )
    beat.start()
    if worker:
        rt.delivery = outbox_delivery(settings)
        if rt.delivery is not None:
            rt.delivery.start()
    log.info(
        "refund runtime started: executor=%s version=%s model=%s worker=%s",
        settings.runtime.executor_id,
        settings.runtime.app_version,
        label,
        worker,
    )
    return rt


def outbox_delivery(settings: Settings) -> DeliveryLoop | None:
    """The outbox's delivery loop for this worker: email with SMTP_HOST, help-desk tickets with
    HELPDESK_WEBHOOK_SECRET; None (messages stay in the outbox) with neither."""
    email, desk = settings.email, settings.helpdesk
    smtp = None
    if email.smtp_host is not None and email.from_address is not None:
        smtp = mail.SmtpConfig(
            host=email.smtp_host,
            port=email.port(),
            security=email.smtp_security,
            from_address=email.from_address,
            username=email.smtp_username,
            password=email.smtp_password.get_secret_value() if email.smtp_password else None,
            timeout_seconds=email.smtp_timeout_seconds,
        )
    tickets = helpdesk_config(settings) if desk.enabled else None
    if smtp is None and tickets is None:
        return None
    url = settings.database.app_database_url
    engine = create_engine(url) if normalize_url(url).startswith("sqlite") else create_engine(url, pool_size=2)
    return DeliveryLoop(
        engine,
        executor_id=settings.runtime.executor_id,
        smtp=smtp,
        tickets=tickets,
        approver_emails=email.approver_emails,
        policy=mail.RetryPolicy(
            max_attempts=email.max_attempts,
            interval_seconds=email.retry_interval_seconds,
            backoff_rate=email.backoff_rate,
            claim_seconds=email.claim_seconds,
        ),
        poll_seconds=email.poll_interval_seconds,
    )


def helpdesk_config(settings: Settings) -> helpdesk.TicketsConfig:
    """Where replies to tickets are posted: the helpdesk API the evidence look-ups read (``TICKETS_API_*``)."""
    evidence = settings.evidence
    return helpdesk.TicketsConfig(
        base_url=evidence.base_url(evidence.tickets_api_base),
        email=evidence.tickets_api_email,
        token=evidence.tickets_api_token.get_secret_value(),
        timeout_seconds=evidence.timeout_seconds,
    )


def _freeze_startup_heap() -> None:
    """Keep what start-up built out of the cyclic garbage collector's full collections.

    Modules, validators, the agent and DBOS's registry (about 190,000 tracked objects) live as long as
    the process, yet every full collection walked them, and a full collection stops the whole process:
    with 2,000 refunds parked for approval one took 0.4-0.7 s, and approvals arriving meanwhile waited.
    Frozen, they are still freed by reference counting; only a reference cycle among them waits for
    ``stop``, which unfreezes them.
    """
    gc.collect()
    gc.freeze()


def _lease_lost() -> None:
    """Fence: another process took our executor id (we were presumed dead), so stop running its steps now."""
    log.critical("exiting: this process no longer owns its executor id; pending work continues elsewhere")
    logging.shutdown()
    os._exit(EXIT_LEASE_LOST)


def stop(workflow_completion_timeout_sec: int = 0) -> None:
    """Stop taking work, give in-flight workflows the timeout to finish, then release the executor lease.

    ``DBOS.destroy`` stops dequeuing first, then waits for what runs. The lease keeps being renewed while
    DBOS drains, so no survivor takes over work that is finishing here; once released, what is left
    PENDING is recovered by a restart with this id or by a survivor's sweep.
    """
    rt = running()
    if rt is not None and rt.delivery is not None:
        rt.delivery.stop()
        rt.delivery.engine.dispose()
    DBOS.destroy(workflow_completion_timeout_sec=workflow_completion_timeout_sec)
    if rt is not None and rt.heartbeat is not None and rt.lease is not None:
        rt.heartbeat.stop()
        heartbeat.release_quietly(rt.heartbeat.engine, rt.lease)
        rt.heartbeat.engine.dispose()
    close_app_database()
    audit.use_anchor(None)
    install(None)
    gc.unfreeze()  # what this runtime built is ordinary garbage now


def client(settings: Settings | None = None) -> DBOSClient:
    """A DBOS client for processes that submit, approve or inspect without running workflows."""
    settings = settings or get_settings()
    return DBOSClient(system_database_url=normalize_url(settings.database.system_database_url), serializer=SERIALIZER)
