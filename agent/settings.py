"""The one place that reads the environment."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import socket
import stat
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from pydantic import BaseModel, Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent import __version__
from steps.records import LIMIT_SCALES, NAME_PATTERN, SUPPORTED_CURRENCIES, quantize, supported

log = logging.getLogger(__name__)

#: The shortest secret of our own accepted, in bytes: as long as the ones generated (32 random bytes).
MIN_SECRET_BYTES = 32
#: Secrets this service shares only with itself: each is refused blank or shorter than ``MIN_SECRET_BYTES``.
OWN_SECRETS = (
    "refund_agent_api_token",
    "approval_signing_secret",
    "refund_agent_session_secret",
    "refund_agent_audit_key",
    "slack_signing_secret",
    "stripe_webhook_secret",
    "metrics_token",
)
#: Keys someone else issues, in whatever form they chose: each is refused blank only.
ISSUED_KEYS = (
    "payments_api_key",
    "refund_agent_model_api_key",
    "refund_agent_model_fallback_api_key",
    "slack_webhook_url",
    "dbos_conductor_key",
    "carrier_api_key",
    "returns_api_key",
    "tickets_api_token",
)
#: Each evidence service's base URL setting and the key its issuer gives (a real base URL needs a real key).
EVIDENCE_KEYS = {
    "carrier_api_base": ("carrier_api_key",),
    "returns_api_base": ("returns_api_key",),
    "tickets_api_base": ("tickets_api_email", "tickets_api_token"),
}
#: What the local evidence sandbox accepts, and the keys' defaults (never sent anywhere else).
SANDBOX_EVIDENCE_KEY = "sandbox_evidence_key"
SANDBOX_TICKETS_EMAIL = "sandbox@example.com"


class UnsafeDataDirectory(Exception):
    """The data directory cannot be made this user's alone."""


class MissingSecret(Exception):
    """A secret that must already exist (it is never generated where it is only checked against)."""


class ModelPrice(BaseModel):
    """What a model's tokens cost, per million, in ``currency``."""

    input_per_million: Decimal = Field(ge=0)
    output_per_million: Decimal = Field(ge=0)
    currency: str = "USD"

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        spent = input_tokens * self.input_per_million + output_tokens * self.output_per_million
        return (spent / 1_000_000).quantize(Decimal("0.000001"))


class Settings(BaseSettings):
    """Service configuration; every field maps to an environment variable of the same name."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    refund_agent_data_dir: Path = Path(".refund-agent")
    """Where the embedded default keeps its SQLite files, logs and generated secrets: this user's alone (made mode
    0700, and its files 0600, at every start)."""
    dbos_system_database_url: str | None = None
    """DBOS system database (checkpoints). Defaults to SQLite in the data directory."""
    database_url: str | None = None
    """Application database (orders, refunds, audit log). Defaults to SQLite in the data directory."""

    refund_agent_model: str | None = None
    """Any Pydantic AI model string (e.g. ``openai:gpt-5.2``). Unset: the deterministic offline model."""
    refund_agent_model_base_url: str | None = None
    """Base URL of an OpenAI-compatible server (Ollama, vLLM); the model name comes from REFUND_AGENT_MODEL."""
    refund_agent_model_api_key: SecretStr | None = None
    """API key of the OpenAI-compatible server at ``REFUND_AGENT_MODEL_BASE_URL``. Issued by that server, so any
    length is accepted; blank is refused."""
    refund_agent_model_fallback: str | None = None
    """A second model, tried within each attempt when the first fails at its provider (a rate limit, a 5xx, a timeout,
    a refused request): any Pydantic AI model string, or the model's name at
    ``REFUND_AGENT_MODEL_FALLBACK_BASE_URL``. Unset: no fallback."""
    refund_agent_model_fallback_base_url: str | None = None
    """Base URL of the fallback's OpenAI-compatible server; its model name comes from REFUND_AGENT_MODEL_FALLBACK."""
    refund_agent_model_fallback_api_key: SecretStr | None = None
    """API key of the server at ``REFUND_AGENT_MODEL_FALLBACK_BASE_URL``. Blank is refused."""
    refund_agent_model_attempts: int = Field(default=4, ge=1, le=10)
    """Attempts at one model request (the first included) on rate limits, 5xx, timeouts and connection errors;
    a refused request (a 4xx such as a wrong key) is not retried."""
    refund_agent_model_retry_interval_seconds: float = Field(default=2.0, ge=0)
    """The wait before the first retry of a model request; each later one waits
    ``REFUND_AGENT_MODEL_BACKOFF_RATE`` times longer. A rate limit's ``Retry-After`` (up to 60 s) is waited first."""
    refund_agent_model_backoff_rate: float = Field(default=2.0, ge=1)
    """How much longer each retry of a model request waits than the one before."""
    refund_agent_model_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long one attempt at a model request may take before it counts as a timeout (and is retried)."""
    refund_agent_model_request_limit: int = Field(default=8, ge=1)
    """Model requests one refund may make (a plain claim makes one, a claim that needs evidence two). Past it the
    refund goes to a person."""
    refund_agent_model_token_limit: int | None = Field(default=None, ge=1)
    """Input plus output tokens one refund may spend at the model; past it the refund goes to a person. Unset: no
    limit."""
    refund_agent_model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Per model (as labelled in the refund's record), what tokens cost, e.g.
    ``{"openai:gpt-5.2": {"input_per_million": "1.25", "output_per_million": "10.00"}}``. Unset: no cost shown."""

    refund_agent_executor_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-0")
    """Unset: the first ``<hostname>-<index>`` whose lease is free (see ``executor_id_pinned``)."""
    refund_agent_app_version: str = __version__
    """DBOS application version; recovery only resumes workflows of the same version (pin it: see the
    upgrades guide). Default: the package version."""

    auto_approve_limit: Decimal = Decimal("100.00")
    """Refunds up to this amount are paid without a person. In the base currency (USD); in another currency it
    counts times ``LIMIT_SCALES`` (15,000 JPY, 30.000 KWD by default) unless ``AUTO_APPROVE_LIMITS`` names it."""
    auto_approve_limits: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency auto-approve limits, in that currency, e.g. ``{"JPY": "20000"}``: they replace the scaled
    ``AUTO_APPROVE_LIMIT`` for the currencies named."""
    absolute_refund_cap: Decimal = Decimal("10000.00")
    """Refunds above this amount are refused outright. In the base currency (USD), scaled like
    ``AUTO_APPROVE_LIMIT`` (1,500,000 JPY, 3,000.000 KWD by default)."""
    absolute_refund_caps: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency caps, as ``AUTO_APPROVE_LIMITS`` is for ``AUTO_APPROVE_LIMIT``."""
    limit_scales: dict[str, Decimal] = Field(default_factory=lambda: dict(LIMIT_SCALES))
    """How many units of a currency one base-currency (USD) unit of a limit counts as, for the limits not set per
    currency: ``{"USD": 1, "EUR": 1, "GBP": 1, "CHF": 1, "JPY": 150, "KWD": 0.3}``, round figures rather than
    exchange rates. Currencies given are merged over these (``{"JPY": 140}`` changes JPY only)."""
    refund_window_days: int = 60
    """Refundable through this many whole days after payment (the last day included)."""
    customer_refund_window_days: int = Field(default=30, ge=1)
    """The rolling window in which one customer's refunds are counted (``CUSTOMER_MAX_REFUNDS``, ``..._AMOUNT``)."""
    customer_max_refunds: int = Field(default=3, ge=1)
    """More refunds than this for one customer inside the window go to a person, however small. One customer is
    every customer id sharing the order's email, shipping address or card, and refunds made at the payment provider
    outside this service count; refused and failed refunds are not counted."""
    customer_max_refund_amount: Decimal = Field(default=Decimal("500.00"), gt=0)
    """More money than this for one customer inside the window goes to a person. In the base currency (USD), scaled
    like ``AUTO_APPROVE_LIMIT`` (75,000 JPY, 150.000 KWD by default)."""
    order_max_open_claims: int = Field(default=1, ge=1)
    """Claims open on one order at once (received, deciding, waiting for a person, paying or settling): a claim made
    after this many goes to a person, never paid on its own, so a customer cannot switch their story on one order.
    Raise it only to load-test many refunds of one order at once."""
    customer_max_refund_amounts: dict[str, Decimal] = Field(default_factory=dict)
    """Per-currency overrides of ``CUSTOMER_MAX_REFUND_AMOUNT``, in that currency, e.g. ``{"JPY": "80000"}``."""

    approval_escalate_after_seconds: float = 4 * 3600
    """After this long without a decision, approvers get one reminder."""
    approval_timeout_seconds: float = 72 * 3600
    """After this long without a decision, the refund is rejected as expired (and its customer told)."""

    refund_agent_api_token: SecretStr | None = None
    """Bearer token for the HTTP API, at least 32 bytes. Unset: generated on first start and kept in the data
    directory."""
    approval_signing_secret: SecretStr | None = None
    """HMAC key of approval links, at least 32 bytes. Unset: generated on first start and kept in the data
    directory."""
    refund_agent_public_url: str | None = None
    """Where approvers reach this service (used in approval links). Unset: http://HOST:PORT."""
    refund_agent_host: str = "127.0.0.1"
    """Where ``refund-agent serve`` listens."""
    refund_agent_port: int = 8000
    """Where ``refund-agent serve`` listens."""
    slack_webhook_url: SecretStr | None = None
    """Incoming webhook for approval requests (issued by Slack: blank is refused). Unset: approval requests go to the
    outbox and the log."""
    slack_signing_secret: SecretStr | None = None
    """Verifies Slack's interactive requests (Approve / Reject buttons); at least 32 bytes (Slack's are 32)."""
    slack_approvers: dict[str, str] = Field(default_factory=dict)
    """Who may decide from Slack, as JSON: ``"<team id>/<user id>"`` -> console operator name, e.g.
    ``{"T0123ABC/U0456DEF": "dana"}``. A click from anyone else is refused; a decision is recorded as the
    operator, by Slack id. Unset: Slack buttons decide nothing."""
    approval_limits: dict[str, dict[str, Decimal]] = Field(default_factory=dict)
    """Approval authority, as JSON: principal -> currency -> the most it may approve, e.g.
    ``{"operator:dana": {"USD": "5000.00"}, "client:helpdesk-bot": {"USD": "500.00"}}``. A principal listed
    may approve only in the currencies listed, up to those amounts; one not listed is not limited. A client or
    OS user acting for an operator is held to that ``operator:<name>``'s limit as well as its own."""
    refund_agent_operators: dict[str, str] = Field(default_factory=dict)
    """Console operators as JSON, name -> "role:password-hash" (role ``viewer``, ``approver`` or ``admin``; the
    hash from ``refund-agent hash-password``). Unset: one ``admin`` whose password is generated into the data
    directory. A change of an operator's role or password, or their removal, ends their console sessions."""
    refund_agent_session_secret: SecretStr | None = None
    """Signs the console's sign-in form cookie and keys its sign-in throttle (sessions themselves are rows in
    the application database); at least 32 bytes. Unset: generated on first start and kept in the data
    directory; processes behind one address share it."""
    oidc_issuer_url: str | None = None
    """The company's OpenID provider, e.g. ``https://acme.okta.com`` (exactly the ``issuer`` of its discovery
    document). Set with ``OIDC_CLIENT_ID`` and ``OIDC_CLIENT_SECRET``, the console offers sign-in through it
    (docs: operations/sign-in). Unset: passwords only."""
    oidc_client_id: str | None = None
    """The console's client id at the provider (its redirect URI: ``<public url>/console/auth/callback``)."""
    oidc_client_secret: SecretStr | None = None
    """The console's client secret at the provider. Issued by the provider: blank is refused."""
    oidc_scopes: str = "openid email profile"
    """Scopes asked for at sign-in (``openid`` is needed; add the one that carries the groups claim if the
    provider wants it, e.g. ``groups`` for Okta)."""
    oidc_groups_claim: str = "groups"
    """The ID token claim holding the operator's groups (a list or a string)."""
    oidc_role_groups: dict[str, Literal["viewer", "approver", "admin"]] = Field(default_factory=dict)
    """Provider groups to console roles, as JSON, e.g. ``{"refund-approvers": "approver", "support":
    "viewer"}``; the most powerful role among an operator's groups counts, taken at each sign-in. A user in
    none of them is refused. A change of this mapping ends the sessions started through the provider."""
    console_password_sign_in: bool = True
    """``false``: the console's local passwords (``REFUND_AGENT_OPERATORS``, or the generated admin) sign no one
    in; only allowed with the OpenID provider configured."""
    refund_agent_trusted_proxies: list[str] = Field(default_factory=list)
    """Reverse proxies in front of the service, as a JSON list of addresses or CIDR networks, e.g.
    ``["10.0.0.0/8", "192.0.2.7"]``. Only when a request comes from one of them does the console read
    ``X-Forwarded-For``, taking the right-most address that is not a listed proxy as the client's (for its
    per-address sign-in limit and the audit log). Unset: the TCP peer is the client, whatever the headers say."""
    refund_agent_audit_key: SecretStr | None = None
    """HMAC key of the audit chain, at least 32 bytes, kept out of the database so that whoever can write the
    database cannot rewrite the chain unnoticed. Unset: generated on first start and kept in the data directory.
    Several hosts writing one database must share one key (set it on every host, and where ``refund-agent audit
    verify`` runs): entries under another key do not verify."""
    refund_agent_audit_unkeyed_entries: int = Field(default=0, ge=0)
    """How many entries at the start of the audit chain predate its key (plain SHA-256, from a release before the
    key; ``refund-agent audit verify --max-unkeyed`` printed the number when the key was set up). 0 (the default,
    and every database begun by a keyed release): any entry without the key's MAC breaks the chain."""
    dbos_conductor_key: SecretStr | None = None
    """Optional: connect to DBOS Conductor (DBOS Console); needs the ``conductor`` extra (dbos[enterprise]). Issued
    by DBOS: blank is refused."""
    refund_agent_dbos_console_url: str | None = None
    """Where a DBOS console shows one workflow, with ``{workflow_id}`` where its id goes, e.g.
    ``http://127.0.0.1:8090/workflows/{workflow_id}`` (dbos-argus on loopback) or DBOS Console's workflow page. The
    operator console links each of a refund's workflows there. Unset: no link."""

    @field_validator("refund_agent_dbos_console_url")
    @classmethod
    def _workflow_link(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith(("http://", "https://")) or "{workflow_id}" not in value):
            raise ValueError(
                "must be an http(s) URL with {workflow_id} in it, e.g. http://127.0.0.1:8090/workflows/{workflow_id}"
            )
        return value

    def dbos_console_link(self, workflow_id: str) -> str | None:
        """The DBOS console's page of one workflow (its id escaped into the URL's path), or None when unset."""
        url = self.refund_agent_dbos_console_url
        return url.replace("{workflow_id}", quote(workflow_id, safe="")) if url else None

    @field_validator(*OWN_SECRETS)
    @classmethod
    def _own_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # The messages never carry the value: they end up in terminals and logs.
        if value is not None:
            secret = value.get_secret_value().strip()
            wanted = f"set at least {MIN_SECRET_BYTES} random bytes (e.g. openssl rand -hex 32)"
            if not secret:
                raise ValueError(f"is blank: {wanted} or leave it unset")
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise ValueError(f"is shorter than {MIN_SECRET_BYTES} bytes: {wanted}")
        return value

    @field_validator(*ISSUED_KEYS)
    @classmethod
    def _issued_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("is blank: set the key its issuer gave you, or leave it unset")
        return value

    @field_validator("carrier_api_key", "returns_api_key", "tickets_api_email", "tickets_api_token")
    @classmethod
    def _real_evidence_services_need_their_keys(cls, value: SecretStr | str, info: ValidationInfo) -> SecretStr | str:
        base = next(b for b, keys in EVIDENCE_KEYS.items() if info.field_name in keys)
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if info.data.get(base) is not None and text in (SANDBOX_EVIDENCE_KEY, SANDBOX_TICKETS_EMAIL):
            raise ValueError(f"is the local sandbox's default but {base.upper()} is set: set what its issuer gave")
        return value

    @field_validator("slack_approvers")
    @classmethod
    def _slack_approvers(cls, value: dict[str, str]) -> dict[str, str]:
        for slack_id, operator in value.items():
            if not re.match(r"^[A-Z0-9]{2,32}/[A-Z0-9]{2,32}$", slack_id):
                raise ValueError(f'Slack approver {slack_id!r}: expected "<team id>/<user id>", e.g. "T0123/U0456"')
            if not re.match(NAME_PATTERN, operator):
                raise ValueError(f"Slack approver {slack_id!r}: {operator!r} is not an operator name")
        return value

    @field_validator("approval_limits")
    @classmethod
    def _approval_limits(cls, value: dict[str, dict[str, Decimal]]) -> dict[str, dict[str, Decimal]]:
        for principal, limits in value.items():
            kind, sep, name = principal.partition(":")
            if not sep or kind not in ("operator", "client", "cli") or not re.match(NAME_PATTERN, name):
                raise ValueError(
                    f'approval limit for {principal!r}: expected "operator:<name>", "client:<name>" or "cli:<user>"'
                )
            for currency, amount in limits.items():
                if not re.match(r"^[A-Z]{3}$", currency) or amount < 0:
                    raise ValueError(
                        f"approval limit for {principal}: {currency} {amount} is not a currency and amount"
                    )
        return value

    @field_validator("refund_agent_operators")
    @classmethod
    def _operators(cls, value: dict[str, str]) -> dict[str, str]:
        for name, spec in value.items():
            role, _, hashed = spec.partition(":")
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"operator name {name!r}: 1-100 letters, digits or ._@- (no ':' or spaces)")
            if name.startswith("oidc."):
                raise ValueError(f"operator name {name!r}: names starting oidc. are the OpenID provider's users'")
            if role not in ("viewer", "approver", "admin") or not hashed.startswith("scrypt$"):
                raise ValueError(f'operator {name!r}: expected "viewer:scrypt$...", "approver:..." or "admin:..."')
        return value

    @model_validator(mode="after")
    def _oidc(self) -> Settings:
        oidc = (self.oidc_issuer_url, self.oidc_client_id, self.oidc_client_secret)
        if any(v is not None for v in oidc) and not all(v is not None for v in oidc):
            raise ValueError("set OIDC_ISSUER_URL, OIDC_CLIENT_ID and OIDC_CLIENT_SECRET together, or none of them")
        if self.oidc_client_secret is not None and not self.oidc_client_secret.get_secret_value().strip():
            raise ValueError("OIDC_CLIENT_SECRET is blank: set the secret the provider issued")
        if self.oidc_issuer_url is not None and not re.match(r"^https?://[^\s/]+", self.oidc_issuer_url):
            raise ValueError("OIDC_ISSUER_URL must be the provider's http(s) issuer URL")
        if not self.console_password_sign_in and self.oidc_issuer_url is None:
            raise ValueError("CONSOLE_PASSWORD_SIGN_IN=false needs OIDC_ISSUER_URL: no one could sign in")
        return self

    @field_validator("refund_agent_trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"trusted proxy {entry!r} is not an IP address or CIDR network") from None
        return value

    payments_api_base: str | None = None
    """Stripe-compatible API base. Unset: the local payments sandbox."""
    payments_api_key: SecretStr = SecretStr("sk_test_sandbox")
    """Key of the Stripe-compatible API; its default is the local sandbox's test key. Issued by the provider, so any
    length is accepted; blank is refused."""
    payments_sandbox_port: int = 12111
    """Where ``refund-agent sandbox-payments`` listens."""
    payments_key_ttl_seconds: float = 24 * 3600
    """How long the provider remembers idempotency keys (Stripe: 24 h)."""
    # Evidence the agent's tools look up (docs/operations/evidence-services.md). Unset base URL: the local
    # evidence sandbox (``refund-agent sandbox-evidence``, started by ``serve``).
    carrier_api_base: str | None = None
    """Carrier tracking API base, EasyPost-shaped (``https://api.easypost.com``). Unset: the local evidence sandbox."""
    carrier_api_key: SecretStr = SecretStr(SANDBOX_EVIDENCE_KEY)
    """The carrier tracking API's key (EasyPost's, sent as the basic-auth username). Issued by the provider: blank is
    refused, and so is the sandbox's default when ``CARRIER_API_BASE`` is set."""
    returns_api_base: str | None = None
    """Warehouse returns API base, ShipBob-shaped (``https://api.shipbob.com``). Unset: the local evidence sandbox."""
    returns_api_key: SecretStr = SecretStr(SANDBOX_EVIDENCE_KEY)
    """The returns API's personal access token (a bearer token). Issued by the provider: blank is refused, and so is
    the sandbox's default when ``RETURNS_API_BASE`` is set."""
    tickets_api_base: str | None = None
    """Helpdesk API base, Zendesk-shaped (``https://<subdomain>.zendesk.com``). Unset: the local evidence sandbox."""
    tickets_api_email: str = SANDBOX_TICKETS_EMAIL
    """The helpdesk agent's email the API token belongs to (Zendesk: ``<email>/token``)."""
    tickets_api_token: SecretStr = SecretStr(SANDBOX_EVIDENCE_KEY)
    """The helpdesk's API token. Issued by the provider: blank is refused, and so is the sandbox's default when
    ``TICKETS_API_BASE`` is set."""
    evidence_sandbox_port: int = 12112
    """Where ``refund-agent sandbox-evidence`` listens (the local carrier, returns and helpdesk APIs)."""
    evidence_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long one request to an evidence service may take before it is retried."""
    evidence_attempts: int = Field(default=4, ge=1, le=10)
    """Attempts per evidence look-up (the first included) on 429, 5xx, timeouts and connection errors."""

    payment_recheck_seconds: float = Field(default=900.0, gt=0)
    """How often a refund the provider has not settled (pending) is read again, webhooks or not."""
    stripe_webhook_secret: SecretStr | None = None
    """The Stripe webhook endpoint's signing secret (``whsec_...``), at least 32 bytes. Unset: generated for the
    sandbox."""

    queue_worker_concurrency: int = 4
    """Refunds a worker decides at once (the ``refunds`` queue)."""
    approval_queue_worker_concurrency: int = 4
    """Decisions, deadlines and approved payments a worker runs at once (the ``approvals`` queue)."""
    queue_polling_interval_seconds: float = 0.1
    """How often a worker looks for work on each queue. It takes at most its concurrency per look."""
    notification_polling_interval_seconds: float = 0.25
    """Passed to DBOS as ``notification_listener_polling_interval_sec``."""
    refund_agent_crash_at: str | None = None
    """Fault injection for tests and the demo: SIGKILL this process at the named point."""

    # Scale-out and deployment: queue limits, executor leases, shutdown, telemetry.
    queue_rate_limit_per_minute: int | None = None
    """Refunds started per minute across all workers (DBOS queue limiter); each makes one model request (two
    when a malformed answer is retried)."""
    executor_heartbeat_seconds: float = 5.0
    """How often a process renews its executor lease and looks for dead executors."""
    executor_stale_after_seconds: float = 30.0
    """A lease not renewed for this long is dead: survivors re-enqueue its pending refunds."""
    shutdown_timeout_seconds: int = 20
    """On SIGTERM, how long in-flight refunds get to finish; the rest is recovered on the next start."""
    refund_agent_log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line, with the refund id where known."""
    refund_agent_metrics_port: int | None = None
    """``refund-agent worker`` serves Prometheus metrics on this port when set (``serve`` has ``/metrics``)."""
    metrics_token: SecretStr | None = None
    """When set (at least 32 bytes), ``/metrics`` wants ``Authorization: Bearer <token>``; unset, it is open
    (read-only, no ids)."""
    otlp_traces_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (e.g. ``http://otel-collector:4318/v1/traces``): DBOS and agent spans. Unset: off."""
    otlp_logs_endpoint: str | None = None
    """OTLP/HTTP logs endpoint. Unset: off."""

    @field_validator("auto_approve_limit", "absolute_refund_cap")
    @classmethod
    def _positive(cls, value: Decimal) -> Decimal:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("auto_approve_limits", "absolute_refund_caps", "customer_max_refund_amounts")
    @classmethod
    def _per_currency(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        return {code: _money_limit(code, amount) for code, amount in ((c.strip().upper(), a) for c, a in value.items())}

    @field_validator("limit_scales")
    @classmethod
    def _scales(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        given = {code.strip().upper(): scale for code, scale in value.items()}
        for code, scale in given.items():
            if not supported(code):
                raise ValueError(f"unsupported currency {code!r}; supported: {', '.join(SUPPORTED_CURRENCIES)}")
            if scale <= 0:
                raise ValueError(f"the scale of {code} must be positive")
        return {**LIMIT_SCALES, **given}

    @property
    def executor_id_pinned(self) -> bool:
        """True when REFUND_AGENT_EXECUTOR_ID was given, so no other index is tried."""
        return "refund_agent_executor_id" in self.model_fields_set

    @property
    def system_database_url(self) -> str:
        return self.dbos_system_database_url or self._sqlite_url("dbos_system.sqlite")

    @property
    def app_database_url(self) -> str:
        return self.database_url or self._sqlite_url("refund_agent.sqlite")

    @property
    def sandbox_database_url(self) -> str:
        return self._sqlite_url("payments_sandbox.sqlite")

    @property
    def payments_base_url(self) -> str:
        return self.payments_api_base or f"http://127.0.0.1:{self.payments_sandbox_port}"

    def api_token(self) -> str:
        if self.refund_agent_api_token is not None:
            return self.refund_agent_api_token.get_secret_value()
        return self._generated_secret("api_token")

    def webhook_secret(self) -> str | None:
        """The secret Stripe's events are signed with; the local sandbox gets a generated one."""
        if self.stripe_webhook_secret is not None:
            return self.stripe_webhook_secret.get_secret_value()
        return self._generated_secret("stripe_webhook.key") if self.uses_sandbox else None

    def signing_secret(self) -> bytes:
        if self.approval_signing_secret is not None:
            return self.approval_signing_secret.get_secret_value().encode()
        return self._generated_secret("approval_signing.key").encode()

    def api_token_file(self) -> Path:
        return self.refund_agent_data_dir.resolve() / "api_token"

    def session_secret(self) -> bytes:
        if self.refund_agent_session_secret is not None:
            return self.refund_agent_session_secret.get_secret_value().encode()
        return self._generated_secret("console_session.key").encode()

    def audit_key(self, *, generate: bool = True) -> bytes:
        """The audit chain's HMAC key; ``generate=False`` (checking a chain) never makes a new one."""
        if self.refund_agent_audit_key is not None:
            return self.refund_agent_audit_key.get_secret_value().encode()
        return self._generated_secret("audit.key", generate=generate).encode()

    def audit_anchor_file(self) -> Path:
        """Where this host keeps the audit chain's anchor (its entry count and last MAC, outside the database)."""
        return self.refund_agent_data_dir.resolve() / "audit.anchor"

    def console_admin_password(self) -> str:
        """The generated password of the default console admin (used only when no operator is configured)."""
        return self._generated_secret("console_admin_password")

    def console_admin_password_file(self) -> Path:
        return self.refund_agent_data_dir.resolve() / "console_admin_password"

    def _generated_secret(self, name: str, *, generate: bool = True) -> str:
        """A random secret kept (mode 0600) in the data directory: the embedded default's convenience."""
        path = self.refund_agent_data_dir / name
        if not path.exists():
            if not generate:
                raise MissingSecret(f"no {name} in {self.refund_agent_data_dir.resolve()}")
            self._private_dir()
            # Written whole under another name, then linked: a process starting at the same moment sees no file
            # or the whole secret, never an empty one, and a link fails if another process linked its own first.
            staged = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(MIN_SECRET_BYTES))
            try:
                os.link(staged, path)
            except FileExistsError:
                pass  # another process made it first: its secret is the one
            finally:
                staged.unlink()
        secret = path.read_text().strip()
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"{path.resolve()} holds a secret shorter than {MIN_SECRET_BYTES} bytes: remove the file to have a "
                "new one generated"
            )
        return secret

    def _private_dir(self) -> Path:
        self.refund_agent_data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.refund_agent_data_dir

    def secure_data_dir(self) -> None:
        """Make an existing data directory this user's alone: the directory 0700, its files 0600.

        An earlier release left them 0755 and 0644 (another local user could read the databases, approval links
        included). Only group and other permissions are taken away, so a file keeps its owner's execute bit, and
        a shared directory such as /tmp (sticky bit) is refused rather than closed to everyone else.
        """
        directory = self.refund_agent_data_dir
        if not directory.is_dir():
            return
        mode = directory.stat().st_mode
        if mode & stat.S_ISVTX:
            raise UnsafeDataDirectory(
                f"{directory.resolve()} is a shared directory (sticky bit); choose one of its own for "
                "REFUND_AGENT_DATA_DIR"
            )
        try:
            _deny_others(directory, mode)
            for entry in directory.iterdir():
                info = entry.lstat()
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    _deny_others(entry, info.st_mode)
        except PermissionError as error:
            raise UnsafeDataDirectory(
                f"cannot make {directory.resolve()} this user's alone ({error.strerror}); choose a directory this "
                "user owns for REFUND_AGENT_DATA_DIR"
            ) from error

    def evidence_base_url(self, base: str | None) -> str:
        """``base`` when set, else the local evidence sandbox."""
        return (base or f"http://127.0.0.1:{self.evidence_sandbox_port}").rstrip("/")

    @property
    def uses_evidence_sandbox(self) -> bool:
        return any(getattr(self, base) is None for base in EVIDENCE_KEYS)

    @property
    def public_url(self) -> str:
        return self.refund_agent_public_url or f"http://{self.refund_agent_host}:{self.refund_agent_port}"

    @property
    def uses_sandbox(self) -> bool:
        return self.payments_api_base is None

    @property
    def embedded(self) -> bool:
        return self.app_database_url.startswith("sqlite")

    def _sqlite_url(self, name: str) -> str:
        return f"sqlite:///{(self._private_dir() / name).resolve()}"


def _money_limit(currency: str, amount: Decimal) -> Decimal:
    """A limit set in a currency: a supported one, positive, in its minor units (no 0.5 JPY)."""
    if not supported(currency):
        raise ValueError(f"unsupported currency {currency!r}; supported: {', '.join(SUPPORTED_CURRENCIES)}")
    if amount <= 0:
        raise ValueError(f"the limit in {currency} must be positive")
    if amount != quantize(amount, currency):
        raise ValueError(f"the limit {amount} {currency} is finer than {currency}'s minor unit")
    return amount


def _deny_others(path: Path, mode: int) -> None:
    if mode & 0o077:
        path.chmod(stat.S_IMODE(mode) & ~0o077)


def settings_problems(error: ValidationError) -> list[str]:
    """Each invalid setting as ``VARIABLE: what is wrong``, never with the value (it may be a secret)."""
    problems = []
    for problem in error.errors(include_input=False, include_url=False):
        name, *inner = [str(part) for part in problem["loc"]] or ["settings"]
        where = f"{name.upper()}" + "".join(f"[{part}]" for part in inner)
        problems.append(f"{where}: {problem['msg'].removeprefix('Value error, ')}")
    return problems


def env_file_warning(path: Path) -> str | None:
    """What is wrong with the ``.env`` file settings are read from, if anything: it holds secrets, so a file other
    users may read (or write: then they choose this service's settings) is named, never its contents."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o077:
        return None
    mode = stat.S_IMODE(info.st_mode)
    return (
        f"{path.resolve()} (mode {mode:04o}) may be read by other users, and it holds settings and secrets: "
        f"read anyway; `chmod 600 {path}` makes it this user's alone"
    )


@cache
def get_settings() -> Settings:
    env_file = Settings.model_config.get("env_file")
    warning = env_file_warning(Path(str(env_file))) if isinstance(env_file, str) else None
    if warning is not None:
        log.warning(warning)
    return Settings()
