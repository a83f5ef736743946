"""The one place that reads the environment: the service's settings, one part per concern.

Each part (agent/settings/<part>.py) reads its own environment variables, under the names operators have always set
(docs/configuration.md lists them all); ``Settings`` holds the parts, and each part of the service takes the part it
needs (``settings.model``, ``settings.payments``, ...).
"""

from __future__ import annotations

import logging
import stat
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from agent.settings.approvals import ApproverSettings
from agent.settings.audit import AuditSettings
from agent.settings.channels import ChannelSettings
from agent.settings.console import ConsoleSettings
from agent.settings.database import DatabaseSettings, MissingSecret, UnsafeDataDirectory
from agent.settings.email import EmailSettings
from agent.settings.evidence import EvidenceSettings
from agent.settings.helpdesk import HelpdeskSettings
from agent.settings.model import ModelPrice, ModelProviderSettings
from agent.settings.part import ENV_FILE, MIN_SECRET_BYTES, Part
from agent.settings.payments import PaymentSettings
from agent.settings.policy import PolicySettings
from agent.settings.questions import CustomerQuestionSettings
from agent.settings.runtime import RuntimeSettings
from agent.settings.server import ServerSettings
from agent.settings.telemetry import TelemetrySettings

__all__ = [
    "ISSUED_KEYS",
    "MIN_SECRET_BYTES",
    "OWN_SECRETS",
    "ApproverSettings",
    "AuditSettings",
    "ChannelSettings",
    "ConsoleSettings",
    "CustomerQuestionSettings",
    "DatabaseSettings",
    "EmailSettings",
    "EvidenceSettings",
    "HelpdeskSettings",
    "MissingSecret",
    "ModelPrice",
    "ModelProviderSettings",
    "PaymentSettings",
    "PolicySettings",
    "RuntimeSettings",
    "ServerSettings",
    "Settings",
    "TelemetrySettings",
    "UnsafeDataDirectory",
    "env_file_warning",
    "get_settings",
    "settings_problems",
]

log = logging.getLogger(__name__)

#: Secrets this service shares only with itself: each is refused blank or shorter than ``MIN_SECRET_BYTES``.
OWN_SECRETS = (
    "refund_agent_api_token",
    "approval_signing_secret",
    "refund_agent_session_secret",
    "refund_agent_audit_key",
    "slack_signing_secret",
    "stripe_webhook_secret",
    "metrics_token",
    "helpdesk_webhook_secret",
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
    "smtp_password",
)


class Settings(BaseModel):
    """Service configuration, one part per concern. ``Settings(**values)`` reads every part from the environment
    (and ``.env``), ``values`` given by environment variable name (``refund_agent_model_attempts=2``) winning."""

    database: DatabaseSettings
    model: ModelProviderSettings
    runtime: RuntimeSettings
    policy: PolicySettings
    server: ServerSettings
    approvals: ApproverSettings
    questions: CustomerQuestionSettings
    channels: ChannelSettings
    email: EmailSettings
    console: ConsoleSettings
    audit: AuditSettings
    payments: PaymentSettings
    evidence: EvidenceSettings
    helpdesk: HelpdeskSettings
    telemetry: TelemetrySettings

    def __init__(self, **values: Any) -> None:
        super().__init__(**_read_parts(values))

    @classmethod
    def parts(cls) -> dict[str, type[Part]]:
        """Each part's name -> its class, in the order the configuration reference lists them."""
        found: dict[str, type[Part]] = {}
        for name, info in cls.model_fields.items():
            assert isinstance(info.annotation, type) and issubclass(info.annotation, Part)
            found[name] = info.annotation
        return found

    @classmethod
    def variables(cls) -> dict[str, tuple[str, str]]:
        """Every environment variable (lower case) -> (its part, its field)."""
        return {
            variable: (part, field)
            for part, kind in cls.parts().items()
            for variable, field in kind.variables().items()
        }

    def value_of(self, variable: str) -> Any:
        """The value of the setting an environment variable sets (any case)."""
        part, field = self.variables()[variable.lower()]
        return getattr(getattr(self, part), field)

    def with_values(self, **values: Any) -> Settings:
        """These settings with some values replaced, given by environment variable name (not validated again, as
        with ``model_copy``)."""
        where = self.variables()
        update: dict[str, dict[str, Any]] = {}
        for variable, value in values.items():
            part, field = where[variable.lower()]
            update.setdefault(part, {})[field] = value
        return self.model_copy(update={part: getattr(self, part).model_copy(update=u) for part, u in update.items()})

    # -- secrets: set, or generated into the data directory on first start --------------------------------------

    def api_token(self) -> str:
        if self.server.api_token is not None:
            return self.server.api_token.get_secret_value()
        return self.database.generated_secret("api_token")

    def api_token_file(self) -> Path:
        return self.database.file("api_token")

    def webhook_secret(self) -> str | None:
        """The secret Stripe's events are signed with; the local sandbox gets a generated one."""
        if self.payments.webhook_secret is not None:
            return self.payments.webhook_secret.get_secret_value()
        return self.database.generated_secret("stripe_webhook.key") if self.payments.uses_sandbox else None

    def signing_secret(self) -> bytes:
        if self.approvals.signing_secret is not None:
            return self.approvals.signing_secret.get_secret_value().encode()
        return self.database.generated_secret("approval_signing.key").encode()

    def session_secret(self) -> bytes:
        if self.console.session_secret is not None:
            return self.console.session_secret.get_secret_value().encode()
        return self.database.generated_secret("console_session.key").encode()

    def audit_key(self, *, generate: bool = True) -> bytes:
        """The audit chain's HMAC key; ``generate=False`` (checking a chain) never makes a new one."""
        if self.audit.key is not None:
            return self.audit.key.get_secret_value().encode()
        return self.database.generated_secret("audit.key", generate=generate).encode()

    def audit_anchor_file(self) -> Path:
        """Where this host keeps the audit chain's anchor (its entry count and last MAC, outside the database)."""
        return self.database.file("audit.anchor")

    def console_admin_password(self) -> str:
        """The generated password of the default console admin (used only when no operator is configured)."""
        return self.database.generated_secret("console_admin_password")

    def console_admin_password_file(self) -> Path:
        return self.database.file("console_admin_password")


def _read_parts(values: dict[str, Any]) -> dict[str, Any]:
    """Each part read from the environment with the values given for it (by environment variable name); every
    invalid setting of every part is raised at once, named by its variable."""
    reading = {name: value for name, value in values.items() if name.startswith("_")}  # _env_file, ...
    given = {name.lower(): value for name, value in values.items() if not name.startswith("_")}
    parts: dict[str, Any] = {}
    errors: list[Any] = []
    for name, kind in Settings.parts().items():
        if name in given:  # a part given whole
            parts[name] = given[name]
            continue
        mine = {variable: given[variable] for variable in kind.variables() if variable in given}
        try:
            parts[name] = kind(**reading, **mine)
        except ValidationError as error:
            errors.extend(_detail(e) for e in error.errors())
    if errors:
        raise ValidationError.from_exception_data("Settings", errors, hide_input=True)  # secrets stay out of logs
    return parts


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
    warning = env_file_warning(Path(ENV_FILE))
    if warning is not None:
        log.warning(warning)
    return Settings()


def _detail(error: Any) -> Any:
    """An error of one part, as one of the errors ``Settings`` raises."""
    detail = {"type": error["type"], "loc": error["loc"], "input": error.get("input")}
    if error.get("ctx"):
        detail["ctx"] = error["ctx"]
    return detail
