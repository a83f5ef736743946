"""Who decides a parked refund and by when: the deadlines, the link's signing key, the operators, their approval
limits, and the Slack users who act for them."""

from __future__ import annotations

import re
from decimal import Decimal

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, own_secret
from steps.records import NAME_PATTERN


class ApproverSettings(Part):
    """Approvals and the identities that give them."""

    escalate_after_seconds: float = Field(default=4 * 3600, alias="approval_escalate_after_seconds")
    """After this long without a decision, approvers get one reminder."""
    timeout_seconds: float = Field(default=72 * 3600, alias="approval_timeout_seconds")
    """After this long without a decision, the refund is rejected as expired (and its customer told)."""
    signing_secret: SecretStr | None = Field(default=None, alias="approval_signing_secret")
    """HMAC key of approval links, at least 32 bytes. Unset: generated on first start and kept in the data
    directory."""
    limits: dict[str, dict[str, Decimal]] = Field(default_factory=dict, alias="approval_limits")
    """Approval authority, as JSON: principal -> currency -> the most it may approve, e.g.
    ``{"operator:dana": {"USD": "5000.00"}, "client:helpdesk-bot": {"USD": "500.00"}}``. A principal listed
    may approve only in the currencies listed, up to those amounts; one not listed is not limited. A client or
    OS user acting for an operator is held to that ``operator:<name>``'s limit as well as its own."""
    operators: dict[str, str] = Field(default_factory=dict, alias="refund_agent_operators")
    """Console operators as JSON, name -> "role:password-hash" (role ``viewer``, ``approver`` or ``admin``; the
    hash from ``refund-agent hash-password``). Unset: one ``admin`` whose password is generated into the data
    directory. A change of an operator's role or password, or their removal, ends their console sessions."""
    slack_approvers: dict[str, str] = Field(default_factory=dict)
    """Who may decide from Slack, as JSON: ``"<team id>/<user id>"`` -> console operator name, e.g.
    ``{"T0123ABC/U0456DEF": "dana"}``. A click from anyone else is refused; a decision is recorded as the
    operator, by Slack id. Unset: Slack buttons decide nothing."""

    _own = field_validator("signing_secret")(own_secret)

    @field_validator("slack_approvers")
    @classmethod
    def _slack_approvers(cls, value: dict[str, str]) -> dict[str, str]:
        for slack_id, operator in value.items():
            if not re.match(r"^[A-Z0-9]{2,32}/[A-Z0-9]{2,32}$", slack_id):
                raise ValueError(f'Slack approver {slack_id!r}: expected "<team id>/<user id>", e.g. "T0123/U0456"')
            if not re.match(NAME_PATTERN, operator):
                raise ValueError(f"Slack approver {slack_id!r}: {operator!r} is not an operator name")
        return value

    @field_validator("limits")
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

    @field_validator("operators")
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
