"""What a running workflow reaches: the agent, its limits and settings, as the process's runtime set them.

``agent.runtime`` builds a ``Runtime`` at start and installs it here; the workflows read it with
``current()``. The workflows import this module, never the one that launches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.usage import UsageLimits

from agent.approvals import ApprovalSettings
from agent.ops import heartbeat
from agent.ops.delivery import DeliveryLoop
from agent.policy import Limits
from agent.settings import Settings


@dataclass
class Runtime:
    settings: Settings
    agent: Agent[Any, Any]
    model_label: str
    limits: Limits
    approvals: ApprovalSettings
    usage_limits: UsageLimits | None = None
    """What one refund may spend at the model (requests, tokens); past it the refund goes to a person."""
    lease: heartbeat.Lease | None = None
    heartbeat: heartbeat.Heartbeat | None = field(default=None, repr=False)
    delivery: DeliveryLoop | None = field(default=None, repr=False)
    """This worker's outbox delivery loop (email, help-desk tickets), when either is configured."""


_runtime: Runtime | None = None


def current() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the refund runtime is not started; call runtime.start() first")
    return _runtime


def running() -> Runtime | None:
    """The runtime if this process started one, else None."""
    return _runtime


def install(rt: Runtime | None) -> None:
    """Set (or, with None, clear) this process's runtime: ``agent.runtime`` does, at start and stop."""
    global _runtime
    _runtime = rt
