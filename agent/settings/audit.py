"""The audit chain's key, and how many entries at its start predate the key."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, own_secret


class AuditSettings(Part):
    """The audit chain's HMAC key."""

    key: SecretStr | None = Field(default=None, alias="refund_agent_audit_key")
    """HMAC key of the audit chain, at least 32 bytes, kept out of the database so that whoever can write the
    database cannot rewrite the chain unnoticed. Unset: generated on first start and kept in the data directory.
    Several hosts writing one database must share one key (set it on every host, and where ``refund-agent audit
    verify`` runs): entries under another key do not verify."""
    unkeyed_entries: int = Field(default=0, ge=0, alias="refund_agent_audit_unkeyed_entries")
    """How many entries at the start of the audit chain predate its key (plain SHA-256, from a release before the
    key; ``refund-agent audit verify --max-unkeyed`` printed the number when the key was set up). 0 (the default,
    and every database begun by a keyed release): any entry without the key's MAC breaks the chain."""

    _own = field_validator("key")(own_secret)
