"""The services the agent's look-ups read (docs/operations/evidence-services.md): carrier tracking, warehouse returns
and the helpdesk. Unset base URL: the local evidence sandbox (``refund-agent sandbox-evidence``, started by
``serve``)."""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from agent.settings.part import Part, issued_key

#: Each evidence service's base URL setting and the key its issuer gives (a real base URL needs a real key).
EVIDENCE_KEYS = {
    "carrier_api_base": ("carrier_api_key",),
    "returns_api_base": ("returns_api_key",),
    "tickets_api_base": ("tickets_api_email", "tickets_api_token"),
}
#: What the local evidence sandbox accepts, and the keys' defaults (never sent anywhere else).
SANDBOX_EVIDENCE_KEY = "sandbox_evidence_key"
SANDBOX_TICKETS_EMAIL = "sandbox@example.com"


class EvidenceSettings(Part):
    """Where each evidence service is, its keys, and how its look-ups are retried."""

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
    sandbox_port: int = Field(default=12112, alias="evidence_sandbox_port")
    """Where ``refund-agent sandbox-evidence`` listens (the local carrier, returns and helpdesk APIs)."""
    timeout_seconds: float = Field(default=10.0, gt=0, alias="evidence_timeout_seconds")
    """How long one request to an evidence service may take before it is retried."""
    attempts: int = Field(default=4, ge=1, le=10, alias="evidence_attempts")
    """Attempts per evidence look-up (the first included) on 429, 5xx, timeouts and connection errors."""

    _issued = field_validator("carrier_api_key", "returns_api_key", "tickets_api_token")(issued_key)

    @field_validator("carrier_api_key", "returns_api_key", "tickets_api_email", "tickets_api_token")
    @classmethod
    def _real_evidence_services_need_their_keys(cls, value: SecretStr | str, info: ValidationInfo) -> SecretStr | str:
        base = next(b for b, keys in EVIDENCE_KEYS.items() if info.field_name in keys)
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if info.data.get(base) is not None and text in (SANDBOX_EVIDENCE_KEY, SANDBOX_TICKETS_EMAIL):
            raise ValueError(f"is the local sandbox's default but {base.upper()} is set: set what its issuer gave")
        return value

    def base_url(self, base: str | None) -> str:
        """``base`` when set, else the local evidence sandbox."""
        return (base or f"http://127.0.0.1:{self.sandbox_port}").rstrip("/")

    @property
    def uses_sandbox(self) -> bool:
        return any(getattr(self, base) is None for base in EVIDENCE_KEYS)
