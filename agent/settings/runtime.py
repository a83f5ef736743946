"""How a process runs its share of the work: its executor id and application version, its queues, its executor
lease, shutdown, and the optional DBOS Conductor."""

from __future__ import annotations

import socket

from pydantic import Field, SecretStr, field_validator

from agent import __version__
from agent.settings.part import Part, issued_key


class RuntimeSettings(Part):
    """A process's identity, queues, leases and shutdown."""

    executor_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-0", alias="refund_agent_executor_id")
    """Unset: the first ``<hostname>-<index>`` whose lease is free (see ``executor_id_pinned``)."""
    app_version: str = Field(default=__version__, alias="refund_agent_app_version")
    """DBOS application version; recovery only resumes workflows of the same version (pin it: see the
    upgrades guide). Default: the package version."""
    queue_worker_concurrency: int = 4
    """Refunds a worker decides at once (the ``refunds`` queue)."""
    approval_queue_worker_concurrency: int = 4
    """Decisions, deadlines and approved payments a worker runs at once (the ``approvals`` queue)."""
    queue_polling_interval_seconds: float = 0.1
    """How often a worker looks for work on each queue. It takes at most its concurrency per look."""
    notification_polling_interval_seconds: float = 0.25
    """Passed to DBOS as ``notification_listener_polling_interval_sec``."""
    queue_rate_limit_per_minute: int | None = None
    """Refunds started per minute across all workers (DBOS queue limiter); each makes one model request (two
    when a malformed answer is retried)."""
    executor_heartbeat_seconds: float = 5.0
    """How often a process renews its executor lease and looks for dead executors."""
    executor_stale_after_seconds: float = 30.0
    """A lease not renewed for this long is dead: survivors re-enqueue its pending refunds."""
    shutdown_timeout_seconds: int = 20
    """On SIGTERM, how long in-flight refunds get to finish; the rest is recovered on the next start."""
    crash_at: str | None = Field(default=None, alias="refund_agent_crash_at")
    """Fault injection for tests and the demo: SIGKILL this process at the named point."""
    conductor_key: SecretStr | None = Field(default=None, alias="dbos_conductor_key")
    """Optional: connect to DBOS Conductor (DBOS Console); needs the ``conductor`` extra (dbos[enterprise]). Issued
    by DBOS: blank is refused."""

    _issued = field_validator("conductor_key")(issued_key)

    @property
    def executor_id_pinned(self) -> bool:
        """True when REFUND_AGENT_EXECUTOR_ID was given, so no other index is tried."""
        return "executor_id" in self.model_fields_set
