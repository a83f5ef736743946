"""How the agent's model requests fail, and what is done about it.

One model request is one DBOS step (pydantic-ai's ``DBOSDurability``). A transient failure (a rate limit, a 5xx, a
timeout, a dropped connection) is retried inside that step with a growing wait, after any ``Retry-After`` the
provider sent; a fallback model, when configured, is tried within each attempt. A request the provider refuses
(a 400, a wrong key) is not retried. Each refund may make at most so many requests and spend so many tokens. When
the model still cannot decide, the workflow sends the refund to a person with ``why_undecided``'s reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

from pydantic_ai.durable_exec.dbos import StepConfig
from pydantic_ai.exceptions import (
    AgentRunError,
    FallbackExceptionGroup,
    ModelAPIError,
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
    RunCancelled,
    UsageLimitExceeded,
)
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

#: The longest ``Retry-After`` waited on before a retry; a provider asking for longer is retried after this.
RETRY_AFTER_CAP_SECONDS = 60.0
_TRANSIENT = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError, ModelRequestTimeout)
_TRANSIENT_STATUS = (408, 409, 425, 429)


@dataclass(frozen=True)
class ModelCalls:
    """How model requests are retried, timed out and limited (from settings; ``agent.runtime`` builds it)."""

    attempts: int = 4
    """Attempts at one model request, the first included."""
    interval_seconds: float = 2.0
    """The wait before the first retry; each later one waits ``backoff_rate`` times longer."""
    backoff_rate: float = 2.0
    timeout_seconds: float = 60.0
    """One attempt at one model's request, then it counts as a timeout (transient)."""
    request_limit: int = 8
    """Model requests one refund may make."""
    token_limit: int | None = None
    """Input plus output tokens one refund may spend; None: no limit."""

    def step_config(self) -> StepConfig:
        """The DBOS step options of every model request step: retried while the failure is transient."""
        config = {
            "retries_allowed": self.attempts > 1,
            "max_attempts": self.attempts,
            "interval_seconds": self.interval_seconds,
            "backoff_rate": self.backoff_rate,
            "should_retry": retry_model_request,  # DBOS StepOptions; pydantic-ai passes the options on as given
        }
        return cast(StepConfig, config)

    def model_settings(self) -> ModelSettings:
        """Each attempt gets its own deadline, set in the provider's client, inside the step (Pydantic AI's
        ``request_timeout`` would cancel the whole step from outside, retries and all)."""
        return ModelSettings(timeout=self.timeout_seconds)

    def usage_limits(self) -> UsageLimits:
        return UsageLimits(request_limit=self.request_limit, total_tokens_limit=self.token_limit)


def transient(error: BaseException) -> bool:
    """Whether sending the same request again later may succeed: a rate limit, a 5xx, a timeout, a lost connection
    (from any model a fallback tried)."""
    if isinstance(error, BaseExceptionGroup):
        return any(transient(e) for e in error.exceptions)
    if isinstance(error, _TRANSIENT):
        return True
    if isinstance(error, ModelHTTPError):
        return error.status_code in _TRANSIENT_STATUS or error.status_code >= 500
    return isinstance(error, TimeoutError)


def retry_after(error: BaseException) -> float | None:
    """The longest wait a provider asked for, in seconds (``Retry-After``), or None."""
    if isinstance(error, BaseExceptionGroup):
        waits = [w for w in (retry_after(e) for e in error.exceptions) if w is not None]
        return max(waits) if waits else None
    return error.retry_after if isinstance(error, ModelAPIError) else None


async def retry_model_request(error: BaseException) -> bool:
    """DBOS's ``should_retry`` for model steps: retry a transient failure, first waiting what the provider asked
    (DBOS then waits its backoff interval on top)."""
    if not transient(error):
        return False
    wait = retry_after(error)
    if wait:
        await asyncio.sleep(min(wait, RETRY_AFTER_CAP_SECONDS))
    return True


def from_the_model(error: BaseException) -> bool:
    """Whether the agent's run failed at the model (its provider, its answers, its limits) rather than elsewhere:
    these refunds go to a person instead of failing. A cancelled run is not the model's failure."""
    if isinstance(error, RunCancelled):
        return False
    return isinstance(error, (AgentRunError, FallbackExceptionGroup, TimeoutError)) or bool(_attempt_errors(error))


def why_undecided(error: BaseException) -> str:
    """The reason approvers read when the model could not decide: what failed, in a few words."""
    attempts = _attempt_errors(error)
    if attempts:
        return f"the model was unavailable: {_name(attempts[-1])} after {len(attempts)} attempts"
    if isinstance(error, UsageLimitExceeded):
        return f"the model reached this refund's usage limit: {error}"
    if isinstance(error, (ModelAPIError, FallbackExceptionGroup, TimeoutError)):
        return f"the model was unavailable: {_name(error)}"
    return f"the model's answer could not be used: {_name(error)}"


def _attempt_errors(error: BaseException) -> list[BaseException]:
    """The errors of each attempt when DBOS gave up retrying a step (its exception carries them as ``errors``)."""
    found = getattr(error, "errors", None)
    if isinstance(found, list) and found and all(isinstance(e, BaseException) for e in found):
        return found
    return []


def _name(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return " / ".join(_name(e) for e in error.exceptions)
    status = getattr(error, "status_code", None)
    return f"{type(error).__name__} (HTTP {status})" if status else type(error).__name__
