"""How approvers are told and answer outside the console: Slack's incoming webhook and its signed buttons."""

from __future__ import annotations

from pydantic import SecretStr, field_validator

from agent.settings.part import Part, issued_key, own_secret


class ChannelSettings(Part):
    """Slack, for approval requests and decisions."""

    slack_webhook_url: SecretStr | None = None
    """Incoming webhook for approval requests (issued by Slack: blank is refused). Unset: approval requests go to the
    outbox and the log."""
    slack_signing_secret: SecretStr | None = None
    """Verifies Slack's interactive requests (Approve / Reject buttons); at least 32 bytes (Slack's are 32)."""

    _issued = field_validator("slack_webhook_url")(issued_key)
    _own = field_validator("slack_signing_secret")(own_secret)
