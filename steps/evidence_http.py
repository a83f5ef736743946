"""How the evidence steps reach their services: configuration, timeouts, and retries on transient errors only.

Retries happen inside the step, not through DBOS step retries, because a 429's Retry-After decides the wait
and DBOS's retry interval is fixed; the look-ups only read, so repeating one is harmless, and the step is
checkpointed once with the answer (or with ``EvidenceUnavailable``) however many attempts it took.
Transient: 429 (waiting what Retry-After says, up to a cap; longer than the cap gives up at once), 5xx,
connection errors and timeouts. Anything else (400, 401, 403, an unexpected 404) is permanent and is not
retried. What is raised names the service and the status only: never a key, never a response body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from steps.tls import client_context

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class EvidenceConfig:
    carrier_base_url: str
    carrier_api_key: str
    returns_base_url: str
    returns_api_key: str
    tickets_base_url: str
    tickets_email: str
    tickets_api_token: str
    stripe_base_url: str
    stripe_api_key: str
    attempts: int = 4
    """Attempts per look-up, the first included."""
    backoff_seconds: float = 0.5
    """Wait before the second attempt; doubled for each later one (when the service gives no Retry-After)."""
    max_wait_seconds: float = 10.0
    """The longest wait between attempts; a Retry-After longer than this gives up at once."""
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0


_config: EvidenceConfig | None = None


def configure(config: EvidenceConfig) -> None:
    global _config
    _config = config


def config() -> EvidenceConfig:
    if _config is None:
        raise RuntimeError("evidence services are not configured; call runtime.start() first")
    return _config


class EvidenceUnavailable(Exception):
    """A look-up failed through its retries, or for good (refused, malformed); the message names the service and
    the status only."""


class Transient(Exception):
    """One attempt failed in a way another attempt may not; ``retry_after``: what the service asked to wait."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after = retry_after


def retrying(service: str, attempt: Callable[[], T]) -> T:
    """``attempt()`` until it returns, raises something permanent, or the attempts run out."""
    cfg = config()
    last = Transient("no attempt")
    for n in range(cfg.attempts):
        try:
            return attempt()
        except Transient as error:
            last = error
        if n + 1 == cfg.attempts:
            break
        wait = last.retry_after if last.retry_after is not None else cfg.backoff_seconds * 2**n
        if wait > cfg.max_wait_seconds:
            raise EvidenceUnavailable(f"{service}: {last.what}, asked to wait {wait:.0f}s") from None
        log.info("%s look-up: %s; attempt %d of %d in %.1fs", service, last.what, n + 2, cfg.attempts, wait)
        time.sleep(wait)
    raise EvidenceUnavailable(f"{service}: {last.what} after {cfg.attempts} attempts") from None


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None  # an HTTP date or nothing: fall back to backoff


def call_json(
    service: str,
    method: str,
    url: str,
    *,
    auth: httpx.Auth | tuple[str, str] | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    body: Any = None,
    not_found: bool = False,
) -> Any:
    """One request (retried while transient); its JSON, or None for a 404 when ``not_found`` allows it."""
    cfg = config()
    timeout = httpx.Timeout(cfg.timeout_seconds, connect=cfg.connect_timeout_seconds)

    def attempt() -> Any:
        try:
            with httpx.Client(timeout=timeout, follow_redirects=False, verify=client_context()) as http:
                response = http.request(method, url, auth=auth, headers=headers, params=params, json=body)
        except httpx.TimeoutException:
            raise Transient("timed out") from None
        except httpx.TransportError as error:
            raise Transient(type(error).__name__) from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise Transient(f"HTTP {status}", _retry_after(response) if status in (429, 503) else None)
        if status == 404 and not_found:
            return None
        if status >= 300:
            raise EvidenceUnavailable(f"{service}: HTTP {status}")
        try:
            return response.json()
        except ValueError:
            raise EvidenceUnavailable(f"{service}: HTTP {status} with a body that is not JSON") from None

    return retrying(service, attempt)


def clip(text: str, limit: int) -> str:
    """``text`` whole when short; else its head and an ellipsis (what the model reads stays small)."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
