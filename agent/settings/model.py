"""Which model proposes refunds and how its requests are made: retries, timeouts, limits per refund, prices."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, Field, SecretStr, field_validator

from agent.settings.part import Part, issued_key


class ModelPrice(BaseModel):
    """What a model's tokens cost, per million, in ``currency``."""

    input_per_million: Decimal = Field(ge=0)
    output_per_million: Decimal = Field(ge=0)
    currency: str = "USD"

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        spent = input_tokens * self.input_per_million + output_tokens * self.output_per_million
        return (spent / 1_000_000).quantize(Decimal("0.000001"))


class ModelProviderSettings(Part):
    """The model, its fallback, and how requests to them are made and bounded."""

    name: str | None = Field(default=None, alias="refund_agent_model")
    """Any Pydantic AI model string (e.g. ``openai:gpt-5.2``). Unset: the deterministic offline model."""
    base_url: str | None = Field(default=None, alias="refund_agent_model_base_url")
    """Base URL of an OpenAI-compatible server (Ollama, vLLM); the model name comes from REFUND_AGENT_MODEL."""
    api_key: SecretStr | None = Field(default=None, alias="refund_agent_model_api_key")
    """API key of the OpenAI-compatible server at ``REFUND_AGENT_MODEL_BASE_URL``. Issued by that server, so any
    length is accepted; blank is refused."""
    fallback: str | None = Field(default=None, alias="refund_agent_model_fallback")
    """A second model, tried within each attempt when the first fails at its provider (a rate limit, a 5xx, a timeout,
    a refused request): any Pydantic AI model string, or the model's name at
    ``REFUND_AGENT_MODEL_FALLBACK_BASE_URL``. Unset: no fallback."""
    fallback_base_url: str | None = Field(default=None, alias="refund_agent_model_fallback_base_url")
    """Base URL of the fallback's OpenAI-compatible server; its model name comes from REFUND_AGENT_MODEL_FALLBACK."""
    fallback_api_key: SecretStr | None = Field(default=None, alias="refund_agent_model_fallback_api_key")
    """API key of the server at ``REFUND_AGENT_MODEL_FALLBACK_BASE_URL``. Blank is refused."""
    attempts: int = Field(default=4, ge=1, le=10, alias="refund_agent_model_attempts")
    """Attempts at one model request (the first included) on rate limits, 5xx, timeouts and connection errors;
    a refused request (a 4xx such as a wrong key) is not retried."""
    retry_interval_seconds: float = Field(default=2.0, ge=0, alias="refund_agent_model_retry_interval_seconds")
    """The wait before the first retry of a model request; each later one waits
    ``REFUND_AGENT_MODEL_BACKOFF_RATE`` times longer. A rate limit's ``Retry-After`` (up to 60 s) is waited first."""
    backoff_rate: float = Field(default=2.0, ge=1, alias="refund_agent_model_backoff_rate")
    """How much longer each retry of a model request waits than the one before."""
    timeout_seconds: float = Field(default=60.0, gt=0, alias="refund_agent_model_timeout_seconds")
    """How long one attempt at a model request may take before it counts as a timeout (and is retried)."""
    request_limit: int = Field(default=8, ge=1, alias="refund_agent_model_request_limit")
    """Model requests one refund may make (a plain claim makes one, a claim that needs evidence two). Past it the
    refund goes to a person."""
    token_limit: int | None = Field(default=None, ge=1, alias="refund_agent_model_token_limit")
    """Input plus output tokens one refund may spend at the model; past it the refund goes to a person. Unset: no
    limit."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict, alias="refund_agent_model_prices")
    """Per model (as labelled in the refund's record), what tokens cost, e.g.
    ``{"openai:gpt-5.2": {"input_per_million": "1.25", "output_per_million": "10.00"}}``. Unset: no cost shown."""

    _issued = field_validator("api_key", "fallback_api_key")(issued_key)
