"""Two refunds of one order running at once on two workers.

Policy checks each refund against the order right before paying (``refunds.prepare_payment``), and
the order's refunded amount only grows after the provider answered (``refunds.record_payment``), so
the amount being paid is reserved in between. Without the reservation both workers pass the check
and a 42.00 order is refunded 42.00 twice; one process alone does not show it (its sync payment step
holds the event loop), two do.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent.domain import RefundRequest
from agent.processes import spawn, stop, wait_for
from agent.submit import submit_refund
from tests.test_money_properties import Service


def test_two_workers_never_refund_one_order_beyond_what_was_captured(tmp_path: Path) -> None:
    svc = Service(tmp_path)
    svc.sandbox.set_faults(latency_ms=2000)  # a slow provider: both refunds are in flight at once
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("w1", "w2"):
            env = {**svc.vars, "REFUND_AGENT_EXECUTOR_ID": name, "QUEUE_WORKER_CONCURRENCY": "1"}
            workers.append(spawn(["worker"], env=env, log=tmp_path / f"{name}.log"))

        def ready() -> bool:
            logs = [tmp_path / f"{name}.log" for name in ("w1", "w2")]
            return all(log.exists() and "running refunds" in log.read_text() for log in logs)

        wait_for(ready, timeout=60, what="both workers")
        keys = ["twice-0001-ord", "twice-0002-ord"]
        for key in keys:
            request = RefundRequest(order_id="ord_1001", message="The mouse is broken; refund it.")
            submit_refund(svc.client, idempotency_key=key, request=request, app_version="0.1.0")
        outcomes: list[str] = sorted(
            svc.client.retrieve_workflow(key).get_result(polling_interval_sec=0.2)["status"] for key in keys
        )
        paid = [int(r["amount"]) for r in svc.sandbox.refunds("ch_ord_1001")]
        assert paid == [4200]  # ord_1001 captured 42.00 USD: paid once, in full
        assert outcomes == ["completed", "rejected"]
    finally:
        for worker in workers:
            stop(worker)
        svc.close()
