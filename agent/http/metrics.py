"""Prometheus metrics.

Two kinds, so that adding processes never double-counts:

- **Cluster state, read from the databases at scrape time** (only the API's ``/metrics`` serves these,
  so scrape one API process for them): refunds by outcome and by in-progress status, parked approvals
  (escalated ones, and ones past their deadline that the deadline workflow has not closed yet), the time
  approvals waited, the depth of the ``refunds`` and ``approvals`` queues in DBOS's system database, and
  the model requests, tokens and (with a price configured) cost that deciding refunds took, by model, and
  what came of the payment provider's events (verified webhooks, re-reads) by source, outcome and reason, and
  the outbox's messages by channel and delivery state (pending, sending, sent, failed).
- **Process counters** (every process; workers serve them on ``REFUND_AGENT_METRICS_PORT``): payment
  retries, counted from DBOS's retry of the payment step.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.settings import ModelPrice, Settings
from steps import mail

log = logging.getLogger(__name__)

TERMINAL = ("completed", "rejected", "failed", "cancelled")
PARKED = "awaiting_approval"
#: Approval waits span seconds (a test, a quick approver) to the 72-hour timeout.
APPROVAL_WAIT_BUCKETS = (10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0, 72 * 3600.0)
_RETRY_MESSAGE = "Step being automatically retried"

PROCESS = CollectorRegistry(auto_describe=True)
PAYMENT_RETRIES = Counter(
    "refund_agent_payment_retries",
    "Payment step attempts that failed transiently and were retried (this process).",
    registry=PROCESS,
)


class PaymentRetryCounter(logging.Handler):
    """DBOS logs every automatic step retry with the error; the payment step is the one whose errors are Stripe's."""

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith(_RETRY_MESSAGE) or not record.exc_info:
            return
        error = record.exc_info[1]
        if error is not None and type(error).__module__.split(".")[0] == "stripe":
            PAYMENT_RETRIES.inc()


def install_process_metrics() -> None:
    dbos_logger = logging.getLogger("dbos")
    if not any(isinstance(h, PaymentRetryCounter) for h in dbos_logger.handlers):
        dbos_logger.addHandler(PaymentRetryCounter(level=logging.WARNING))


def _as_datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


class ClusterCollector(Collector):
    """Reads the cluster's state from the application and DBOS system databases on every scrape."""

    def __init__(
        self,
        app_engine: sa.Engine,
        client: Any,
        queues: Sequence[str],
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        self.app_engine, self.client, self.queues = app_engine, client, tuple(queues)
        self.prices = dict(prices or {})

    def collect(self) -> Iterator[Metric]:
        from steps.store import approval_decisions, approval_requests, customer_questions, provider_events, refunds

        now = datetime.now(UTC)
        undecided = approval_requests.outerjoin(
            approval_decisions, approval_decisions.c.refund_id == approval_requests.c.refund_id
        )
        with self.app_engine.connect() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(sa.select(refunds.c.status, sa.func.count()).group_by(refunds.c.status)).all()
            )
            waits = conn.execute(
                sa.select(
                    approval_decisions.c.decision, approval_decisions.c.decided_at, approval_requests.c.requested_at
                ).join(approval_requests, approval_requests.c.refund_id == approval_decisions.c.refund_id)
            ).all()
            open_requests = (
                sa.select(sa.func.count()).select_from(undecided).where(approval_decisions.c.refund_id.is_(None))
            )
            escalated = conn.execute(open_requests.where(approval_requests.c.escalated_at.is_not(None))).scalar_one()
            overdue = conn.execute(open_requests.where(approval_requests.c.expires_at < now)).scalar_one()
            usage = conn.execute(
                sa.select(
                    refunds.c.model,
                    sa.func.sum(refunds.c.model_requests),
                    sa.func.sum(refunds.c.input_tokens),
                    sa.func.sum(refunds.c.output_tokens),
                )
                .where(refunds.c.model_requests.is_not(None))
                .group_by(refunds.c.model)
            ).all()
            events = provider_events.c
            event_counts = conn.execute(
                sa.select(events.source, events.outcome, events.reason, sa.func.count()).group_by(
                    events.source, events.outcome, events.reason
                )
            ).all()
            deliveries = mail.delivery_counts(conn)
            q = customer_questions.c
            questions = {
                str(state): int(n) for state, n in conn.execute(sa.select(q.state, sa.func.count()).group_by(q.state))
            }
            questions_overdue = conn.execute(
                sa.select(sa.func.count()).select_from(customer_questions).where(q.state == "open", q.expires_at < now)
            ).scalar_one()
        outcomes = CounterMetricFamily(
            "refund_agent_refunds", "Refunds that reached an outcome, by outcome.", labels=["outcome"]
        )
        for outcome in TERMINAL:
            outcomes.add_metric([outcome], by_status.get(outcome, 0))
        yield outcomes
        in_progress = GaugeMetricFamily(
            "refund_agent_refunds_in_progress", "Refunds not finished yet, by status.", labels=["status"]
        )
        for status, count in sorted(by_status.items()):
            if status not in TERMINAL:
                in_progress.add_metric([status], count)
        yield in_progress
        yield GaugeMetricFamily(
            "refund_agent_parked_approvals",
            "Refunds parked waiting for a person's decision.",
            value=by_status.get(PARKED, 0),
        )
        yield GaugeMetricFamily(
            "refund_agent_parked_approvals_escalated",
            "Parked refunds whose approvers were reminded (escalated) and that are still undecided.",
            value=escalated,
        )
        yield GaugeMetricFamily(
            "refund_agent_approval_deadlines_overdue",
            "Undecided approval requests past their deadline that no deadline workflow has closed yet.",
            value=overdue,
        )
        asked = GaugeMetricFamily(
            "refund_agent_customer_questions",
            "Questions refunds asked their customers, by state: open (waiting for the customer), answered, expired, "
            "ended or to_person (a support lead ended the wait or sent it to a person).",
            labels=["state"],
        )
        for state in ("open", "answered", "expired", "ended", "to_person"):
            asked.add_metric([state], questions.get(state, 0))
        yield asked
        yield GaugeMetricFamily(
            "refund_agent_customer_questions_overdue",
            "Open questions past their deadline that no deadline workflow has closed yet.",
            value=questions_overdue,
        )
        yield self._approval_waits(waits)
        yield from self._model_usage(usage)
        provider = CounterMetricFamily(
            "refund_agent_provider_events",
            "What the payment provider told us about refunds (verified webhook events; re-reads that settled a refund "
            "or were refused), by source, outcome (accepted, ignored, rejected) and reason.",
            labels=["source", "outcome", "reason"],
        )
        for source, outcome, reason, count in sorted(event_counts):
            provider.add_metric([source, outcome, reason], int(count))
        yield provider
        yield _outbox_messages(deliveries)
        depth = GaugeMetricFamily(
            "refund_agent_queue_depth", "Workflows on a queue, by queue and DBOS status.", labels=["queue", "status"]
        )
        for queue in self.queues:
            for status in ("ENQUEUED", "PENDING"):
                found = self.client.list_queued_workflows(
                    queue_name=queue, status=status, load_input=False, load_output=False
                )
                depth.add_metric([queue, status], len(found))
        yield depth

    def _model_usage(self, rows: Sequence[Any]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "refund_agent_model_requests", "Model requests made deciding refunds, by model.", labels=["model"]
        )
        tokens = CounterMetricFamily(
            "refund_agent_model_tokens", "Tokens spent deciding refunds, by model and kind.", labels=["model", "kind"]
        )
        cost = CounterMetricFamily(
            "refund_agent_model_cost",
            "What deciding refunds cost at the model, by model and currency (models with a configured price).",
            labels=["model", "currency"],
        )
        for model, made, tokens_in, tokens_out in rows:
            label = model or "unknown"
            requests.add_metric([label], int(made or 0))
            tokens.add_metric([label, "input"], int(tokens_in or 0))
            tokens.add_metric([label, "output"], int(tokens_out or 0))
            price = self.prices.get(model or "")
            if price is not None:
                cost.add_metric([label, price.currency], float(price.cost(int(tokens_in or 0), int(tokens_out or 0))))
        yield requests
        yield tokens
        yield cost

    @staticmethod
    def _approval_waits(rows: Sequence[Any]) -> HistogramMetricFamily:
        counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(APPROVAL_WAIT_BUCKETS) + 1))
        sums: dict[str, float] = defaultdict(float)
        for decision, decided_at, requested_at in rows:
            decided, asked = _as_datetime(decided_at), _as_datetime(requested_at)
            if decided is None or asked is None:
                continue
            if (decided.tzinfo is None) != (asked.tzinfo is None):
                decided, asked = decided.replace(tzinfo=None), asked.replace(tzinfo=None)
            wait = max((decided - asked).total_seconds(), 0.0)
            sums[decision] += wait
            index = next((i for i, bound in enumerate(APPROVAL_WAIT_BUCKETS) if wait <= bound), -1)
            counts[decision][index] += 1
        family = HistogramMetricFamily(
            "refund_agent_approval_wait_seconds",
            "Time from an approval request to the person's decision, by decision.",
            labels=["decision"],
        )
        for decision in sorted(counts):
            cumulative, buckets = 0, []
            for bound, count in zip((*APPROVAL_WAIT_BUCKETS, float("inf")), counts[decision], strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
            family.add_metric([decision], buckets, sum_value=sums[decision])
        return family


def _outbox_messages(counts: Sequence[tuple[str, str, int]]) -> GaugeMetricFamily:
    found = {(channel, state): count for channel, state, count in counts}
    family = GaugeMetricFamily(
        "refund_agent_outbox_messages",
        "Messages in the outbox by channel and delivery state: pending (not sent yet, or waiting to retry), sending "
        "(claimed by a worker), sent, failed (attempts ran out or refused for good).",
        labels=["channel", "state"],
    )
    for channel in sorted({channel for channel, _ in found} | set(mail.EMAIL_CHANNELS)):
        for state in mail.DELIVERY_STATES:
            family.add_metric([channel, state], found.get((channel, state), 0))
    return family


def api_registry(
    app_engine: sa.Engine, client: Any, queues: Sequence[str], prices: Mapping[str, ModelPrice] | None = None
) -> CollectorRegistry:
    """What the API's ``/metrics`` serves: cluster state plus this process's counters."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(app_engine, client, queues, prices))
    registry.register(_ProcessCollector())
    install_process_metrics()
    return registry


class _ProcessCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from PROCESS.collect()


def serve_worker_metrics(settings: Settings) -> None:
    """A worker's own counters on ``REFUND_AGENT_METRICS_PORT`` (plain HTTP, in a daemon thread)."""
    assert settings.telemetry.metrics_port is not None
    install_process_metrics()
    start_http_server(settings.telemetry.metrics_port, addr=settings.server.host, registry=PROCESS)
    log.info("worker metrics on http://%s:%d/metrics", settings.server.host, settings.telemetry.metrics_port)
