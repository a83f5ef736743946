"""The payment provider (Stripe-compatible; unset, the local payments sandbox), its webhooks, and how often a refund
it has not settled is read again."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, issued_key, own_secret


class PaymentSettings(Part):
    """The payment provider and its webhooks."""

    api_base: str | None = Field(default=None, alias="payments_api_base")
    """Stripe-compatible API base. Unset: the local payments sandbox."""
    api_key: SecretStr = Field(default=SecretStr("sk_test_sandbox"), alias="payments_api_key")
    """Key of the Stripe-compatible API; its default is the local sandbox's test key. Issued by the provider, so any
    length is accepted; blank is refused."""
    sandbox_port: int = Field(default=12111, alias="payments_sandbox_port")
    """Where ``refund-agent sandbox-payments`` listens."""
    key_ttl_seconds: float = Field(default=24 * 3600, alias="payments_key_ttl_seconds")
    """How long the provider remembers idempotency keys (Stripe: 24 h)."""
    recheck_seconds: float = Field(default=900.0, gt=0, alias="payment_recheck_seconds")
    """How often a refund the provider has not settled (pending) is read again, webhooks or not."""
    webhook_secret: SecretStr | None = Field(default=None, alias="stripe_webhook_secret")
    """The Stripe webhook endpoint's signing secret (``whsec_...``), at least 32 bytes. Unset: generated for the
    sandbox."""

    _issued = field_validator("api_key")(issued_key)
    _own = field_validator("webhook_secret")(own_secret)

    @property
    def base_url(self) -> str:
        return self.api_base or f"http://127.0.0.1:{self.sandbox_port}"

    @property
    def uses_sandbox(self) -> bool:
        return self.api_base is None
