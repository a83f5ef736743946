"""Telemetry: OTLP traces of DBOS workflows and agent runs reach a collector; logs are JSON with refund ids."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent.domain import RefundRequest
from agent.ops.processes import wait_for
from agent.runtime import dbos_config
from agent.submit import submit_refund
from tests.conftest import Env
from tests.identities import HELPDESK
from tests.scale_cluster import Cluster
from tests.servers import ThreadedServer

MESSAGE = "My parcel was crushed in transit, please refund 5.00"


class Collector(ThreadedServer):
    """An OTLP/HTTP traces receiver: keeps every exported span's name, attributes and the raw bodies."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, str]]] = []
        self.raw: list[bytes] = []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/traces")
        async def traces(request: Request) -> Response:
            body = await request.body()
            export = ExportTraceServiceRequest.FromString(body)
            with self.lock:
                self.raw.append(body)
                for resource in export.resource_spans:
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            attrs = {a.key: a.value.string_value for a in span.attributes}
                            self.spans.append((span.name, attrs))
            return Response(status_code=200)

        super().__init__(app)
        self.start()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.stop()


def test_otlp_is_off_unless_an_endpoint_is_set(env: Env) -> None:
    assert "enable_otlp" not in dbos_config(env.settings())
    config = dbos_config(env.settings(otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces"))
    assert config.get("enable_otlp") is True
    assert config.get("otlp_traces_endpoints") == ["http://127.0.0.1:4318/v1/traces"]


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_worker_exports_workflow_and_agent_spans_and_logs_json_with_refund_ids(
    env: Env, collector: Collector, tmp_path: Path
) -> None:
    cluster = Cluster(env, tmp_path / "logs")
    try:
        cluster.worker(
            "traced",
            OTLP_TRACES_ENDPOINT=f"{collector.base_url}/v1/traces",
            REFUND_AGENT_LOG_FORMAT="json",
        )
        request = RefundRequest(order_id="ord_1001", message=MESSAGE, amount=Decimal("5.00"))
        submit_refund(
            cluster.client, idempotency_key="traced-refund-1", requester=HELPDESK, request=request, app_version="0.1.0"
        )
        cluster.wait_done(["traced-refund-1"])

        def exported() -> set[str] | None:
            with collector.lock:
                names = {name for name, _ in collector.spans}
            agent_spans = {n for n in names if n.startswith("invoke_agent") or n.startswith("chat")}
            return names if "refund" in names and agent_spans else None

        names = wait_for(exported, timeout=60, what="workflow and agent spans at the collector", interval=0.5)
        assert "payments.issue_refund" in names
        with collector.lock:
            workflow_attrs = [attrs for name, attrs in collector.spans if name == "refund"]
            raw = b"".join(collector.raw)
        assert any(attrs.get("executorID") == "traced" for attrs in workflow_attrs)
        assert MESSAGE.encode() not in raw  # the customer's words stay out of traces

        lines = [json.loads(line) for line in cluster.log("traced").splitlines() if line.startswith("{")]
        assert any(line.get("refund_id") == "traced-refund-1" for line in lines)
        assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    except BaseException:
        print(cluster.dump_logs())
        raise
    finally:
        cluster.close()
