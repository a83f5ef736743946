"""Structured logs: one JSON object per line, carrying the refund id (= DBOS workflow id) where known."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from dbos import DBOS

from agent.domain import refund_id_of
from agent.settings import TelemetrySettings

# Attributes every LogRecord has; anything else on a record was passed through ``extra=`` and is kept.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


def current_refund_id() -> str | None:
    """The refund whose workflow this thread or task runs, if any (workflow ids derive from refund ids)."""
    workflow_id = DBOS.workflow_id
    return refund_id_of(workflow_id) if workflow_id else None


class RefundIdFilter(logging.Filter):
    """Stamps ``refund_id`` on records logged inside a refund's workflow or steps."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "refund_id", None) is None:
            try:
                record.refund_id = current_refund_id()
            except Exception:  # logging must never fail because of DBOS's context
                record.refund_id = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None and key not in entry:
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(telemetry: TelemetrySettings) -> None:
    """Switch the root handlers to JSON when REFUND_AGENT_LOG_FORMAT=json; stamp refund ids either way."""
    root = logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, RefundIdFilter) for f in handler.filters):
            handler.addFilter(RefundIdFilter())
        if telemetry.log_format == "json":
            handler.setFormatter(JsonFormatter())
