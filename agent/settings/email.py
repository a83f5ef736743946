"""How outbox messages leave by email: the SMTP server, the sender, the approvers' addresses, retries and leases."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from agent.settings.part import Part, issued_key
from steps.records import NAME_PATTERN

_ADDRESS = re.compile(r"^[^@\s<>]+@[^@\s<>]+$")
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class EmailSettings(Part):
    """Email over SMTP: customers' messages, approvers' requests with their links, operators' alerts."""

    smtp_host: str | None = None
    """SMTP server that sends the outbox's messages. Unset: messages stay in the outbox (nothing is emailed)."""
    smtp_port: int | None = Field(default=None, ge=1, le=65535)
    """Its port. Unset: 465 with ``ssl``, else 587."""
    smtp_security: Literal["starttls", "ssl", "none"] = "starttls"
    """``starttls`` (upgrade a plain connection), ``ssl`` (TLS from the start) or ``none`` (plain: loopback only when
    a password is set)."""
    smtp_username: str | None = None
    """User to log in as; unset: no login."""
    smtp_password: SecretStr | None = None
    """Password of ``SMTP_USERNAME`` (issued by the mail provider: blank is refused). Never logged."""
    smtp_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long one SMTP operation may take before the attempt fails and is retried."""
    from_address: str | None = Field(default=None, alias="email_from")
    """The From address, e.g. ``Refunds <refunds@example.com>``; required with ``SMTP_HOST``. Its domain ends
    every Message-ID."""
    approver_emails: dict[str, str] = Field(default_factory=dict)
    """Approvers' addresses as JSON, console operator name -> address, e.g. ``{"dana": "dana@example.com"}``. An
    approver not listed gets no email; operator alerts go to every address listed."""
    poll_interval_seconds: float = Field(default=2.0, gt=0, alias="email_poll_interval_seconds")
    """How often a worker looks for messages due."""
    max_attempts: int = Field(default=8, ge=1, alias="email_max_attempts")
    """Attempts per message before it is recorded ``failed`` (a refusal of every recipient fails at once)."""
    retry_interval_seconds: float = Field(default=5.0, gt=0, alias="email_retry_interval_seconds")
    """Wait after the first failed attempt; each next wait is ``EMAIL_BACKOFF_RATE`` times longer (at most an hour)."""
    backoff_rate: float = Field(default=2.0, ge=1, alias="email_backoff_rate")
    """Growth of the wait between attempts."""
    claim_seconds: float = Field(default=120.0, gt=0, alias="email_claim_seconds")
    """How long a worker holds a message it is sending; a claim left by a dead worker is taken over after it (a
    restart with the same executor id takes it over at once). At least twice ``SMTP_TIMEOUT_SECONDS``."""

    _issued = field_validator("smtp_password")(issued_key)

    @field_validator("approver_emails")
    @classmethod
    def _approver_emails(cls, value: dict[str, str]) -> dict[str, str]:
        for operator, address in value.items():
            if not re.match(NAME_PATTERN, operator):
                raise ValueError(f"approver email: {operator!r} is not an operator name")
            if not _ADDRESS.match(address):
                raise ValueError(f"approver email of {operator}: not an email address")
        return value

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.smtp_host is None:
            return self
        if not self.from_address or "@" not in self.from_address:
            raise ValueError("EMAIL_FROM: set the From address (e.g. refunds@example.com) when SMTP_HOST is set")
        if self.smtp_security == "none" and self.smtp_password is not None and self.smtp_host not in _LOOPBACK:
            raise ValueError("SMTP_SECURITY: none would send SMTP_PASSWORD in clear text; use starttls or ssl")
        if self.claim_seconds < 2 * self.smtp_timeout_seconds:
            raise ValueError("EMAIL_CLAIM_SECONDS: at least twice SMTP_TIMEOUT_SECONDS, so a send keeps its claim")
        return self

    @property
    def enabled(self) -> bool:
        return self.smtp_host is not None

    def port(self) -> int:
        if self.smtp_port is not None:
            return self.smtp_port
        return 465 if self.smtp_security == "ssl" else 587

    def summary(self) -> str:
        """One line on where messages go (no credentials)."""
        if self.smtp_host is None:
            return "not sent: SMTP_HOST is unset, messages stay in the outbox"
        return f"via {self.smtp_host}:{self.port()} ({self.smtp_security}) from {self.from_address}"
