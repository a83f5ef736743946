"""The help desk as the front door (docs/operations/helpdesk.md): its signed webhook, whom it acts as, and where a
ticket's order is."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, own_secret
from steps.records import NAME_PATTERN


class HelpdeskSettings(Part):
    """Zendesk's webhook (tickets start refunds, customers' comments are kept) and posting replies back to the ticket
    (through the helpdesk API of ``TICKETS_API_BASE``)."""

    webhook_secret: SecretStr | None = Field(default=None, alias="helpdesk_webhook_secret")
    """The webhook's signing secret, as Zendesk shows it (Admin Center > Webhooks > the webhook > Signing secret);
    at least 32 bytes. Unset: ``POST /webhooks/helpdesk`` answers 401 and nothing is posted to tickets."""
    principal: str = Field(default="helpdesk", alias="helpdesk_principal")
    """Who refunds started by the help desk are requested by: the API client ``client:<name>``. Whoever signs with
    the secret is this client; nothing in the body names anyone. It may never decide those refunds."""
    tolerance_seconds: int = Field(default=300, ge=1, le=3600, alias="helpdesk_webhook_tolerance_seconds")
    """How far a delivery's ``X-Zendesk-Webhook-Signature-Timestamp`` may be from now (either way) before it is
    refused as stale."""

    _own = field_validator("webhook_secret")(own_secret)

    @field_validator("principal")
    @classmethod
    def _principal_is_a_name(cls, value: str) -> str:
        if not re.match(NAME_PATTERN, value):
            raise ValueError("is not 1-100 letters, digits or ._@- (no ':')")
        return value

    @property
    def enabled(self) -> bool:
        return self.webhook_secret is not None
