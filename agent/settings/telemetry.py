"""What a process tells about itself: its log format, Prometheus metrics, and OTLP traces and logs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, own_secret


class TelemetrySettings(Part):
    """Logs, metrics and traces."""

    log_format: Literal["text", "json"] = Field(default="text", alias="refund_agent_log_format")
    """``json``: one JSON object per log line, with the refund id where known."""
    metrics_port: int | None = Field(default=None, alias="refund_agent_metrics_port")
    """``refund-agent worker`` serves Prometheus metrics on this port when set (``serve`` has ``/metrics``)."""
    metrics_token: SecretStr | None = None
    """When set (at least 32 bytes), ``/metrics`` wants ``Authorization: Bearer <token>``; unset, it is open
    (read-only, no ids)."""
    otlp_traces_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (e.g. ``http://otel-collector:4318/v1/traces``): DBOS and agent spans. Unset: off."""
    otlp_logs_endpoint: str | None = None
    """OTLP/HTTP logs endpoint. Unset: off."""

    _own = field_validator("metrics_token")(own_secret)
