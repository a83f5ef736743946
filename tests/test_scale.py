"""Scale-out: executor leases, dead-worker takeover, racing recoveries, graceful SIGTERM, metrics.

Real processes on real databases; the payments sandbox (which outlives every worker) keeps the ledger
that says how many refunds were paid.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from dbos import DBOS
from prometheus_client import generate_latest

from agent import runtime
from agent.approvals import APPROVAL_QUEUE, family
from agent.domain import RefundRequest
from agent.http import metrics
from agent.ops import heartbeat
from agent.ops.processes import wait_for
from agent.status import wait_for_outcome
from agent.submit import submit_refund
from steps.store import app_db, db_now_ms, executor_leases, refunds
from tests import web
from tests.conftest import BACKENDS, Env
from tests.identities import HELPDESK
from tests.scale_cluster import API_TOKEN, Cluster

postgres_only = pytest.mark.skipif("postgres" not in BACKENDS, reason="REFUND_AGENT_TEST_POSTGRES_URL=off")
FAST_LEASES = {"EXECUTOR_HEARTBEAT_SECONDS": "0.5", "EXECUTOR_STALE_AFTER_SECONDS": "5"}
#: Orders with room for many one-minor-unit refunds (as in benchmarks/http_load.py).
SMALL = [("ord_1001", "USD", "0.01"), ("ord_1002", "USD", "0.01"), ("ord_1003", "EUR", "0.01"),
         ("ord_1007", "USD", "0.01"), ("ord_1010", "GBP", "0.01")]  # fmt: skip


@pytest.fixture
def cluster(env: Env, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(env, tmp_path / "logs", **FAST_LEASES)
    try:
        yield c
    except BaseException:
        print(c.dump_logs())
        raise
    finally:
        c.close()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    raise AssertionError(f"{name} not in the metrics:\n{text}")


def assert_paid_once_each(env: Env, cluster: Cluster, refunds: dict[str, str]) -> None:
    """Every refund completed, its payment step ran once, and the provider holds one refund per key."""
    keys: Counter[str] = Counter()
    for order_id in set(refunds.values()):
        keys.update(r["metadata"]["idempotency_key"] for r in env.sandbox.refunds(f"ch_{order_id}"))
    for refund_id, order_id in refunds.items():
        outcome = wait_for_outcome(cluster.client, refund_id, timeout=120)
        assert outcome["status"] == "completed", (refund_id, outcome)
        assert keys[f"refund:{refund_id}:{order_id}"] == 1, refund_id
        payments = 0
        for workflow_id in family(refund_id):
            steps = cluster.client.list_workflow_steps(workflow_id, load_output=False)
            payments += [s["function_name"] for s in steps].count("payments.issue_refund")
            assert len({s["function_id"] for s in steps}) == len(steps)
        assert payments == 1, refund_id
    assert sum(keys.values()) == len(refunds)
    assert env.sandbox.stats()["refunds_applied"] == len(refunds)


def test_second_process_with_a_live_executor_id_is_refused(env: Env, cluster: Cluster) -> None:
    first = cluster.worker("shared-id")
    second = cluster.start("shared-id-again", ["worker"], REFUND_AGENT_EXECUTOR_ID="shared-id")
    code = wait_for(second.poll, timeout=90, what="the second process to exit")

    assert code == 3
    assert f"executor id 'shared-id' is in use by pid {first.pid}" in cluster.log("shared-id-again")
    assert first.poll() is None
    # The refused process ran nothing: the one live owner pays the refund once.
    request = RefundRequest(order_id="ord_1001", message="Broken, please refund 5.00", amount=Decimal("5.00"))
    submit_refund(
        cluster.client, idempotency_key="one-owner-1", requester=HELPDESK, request=request, app_version="0.1.0"
    )
    cluster.wait_done(["one-owner-1"])
    assert_paid_once_each(env, cluster, {"one-owner-1": "ord_1001"})
    assert cluster.statuses(["one-owner-1"])["one-owner-1"].executor_id == "shared-id"


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_unpinned_processes_take_hostname_index_ids_in_turn(env: Env, cluster: Cluster) -> None:
    a = cluster.start("unpinned-a", ["worker"], REFUND_AGENT_EXECUTOR_ID="")
    cluster.wait_running("unpinned-a", a)
    b = cluster.start("unpinned-b", ["worker"], REFUND_AGENT_EXECUTOR_ID="")
    cluster.wait_running("unpinned-b", b)

    held = {row.pid: row.executor_id for row in cluster.leases().values() if row.state == heartbeat.RUNNING}
    assert held[a.pid].rsplit("-", 1)[1] == "0"
    assert held[b.pid].rsplit("-", 1)[1] == "1"
    assert held[a.pid].rsplit("-", 1)[0] == held[b.pid].rsplit("-", 1)[0]


@postgres_only
@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_worker_killed_for_good_survivors_finish_all_fifty_refunds_once(env: Env, cluster: Cluster) -> None:
    env.sandbox.set_faults(latency_ms=1000)  # keeps refunds in flight on both workers until the kill
    cluster.api()
    cluster.worker("worker-a")
    doomed = cluster.worker("worker-b")
    refunds = {f"fifty-{i:02d}": SMALL[i % len(SMALL)] for i in range(50)}
    for refund_id, (order_id, currency, amount) in refunds.items():
        assert cluster.submit_http(refund_id, order_id, amount, currency) == 202

    def b_has_work() -> list[str] | None:
        running = cluster.client.list_workflows(status="PENDING", executor_id="worker-b", load_input=False)
        done = cluster.client.list_workflows(status="SUCCESS", load_input=False, load_output=False)
        return [w.workflow_id for w in running] if running and len(done) >= 5 else None

    wait_for(b_has_work, timeout=120, what="worker-b to be mid-way through refunds")
    doomed.send_signal(signal.SIGKILL)
    assert wait_for(doomed.poll, timeout=30, what="worker-b to die") == -signal.SIGKILL
    # Read after the kill: a refund worker-b finished between the first read and the signal is its own.
    stranded = cluster.client.list_workflows(status="PENDING", executor_id="worker-b", load_input=False)
    taken_from_b = [w.workflow_id for w in stranded]
    assert taken_from_b

    final = cluster.wait_done(list(refunds))
    assert {w.status for w in final.values()} == {"SUCCESS"}
    assert all(final[r].executor_id != "worker-b" for r in taken_from_b)
    assert cluster.leases()["worker-b"].state == heartbeat.RECOVERED
    assert_paid_once_each(env, cluster, {r: order for r, (order, _, _) in refunds.items()})
    assert not cluster.client.list_workflows(status=["PENDING", "ENQUEUED"], load_input=False)
    scraped = web.get(f"{cluster.api_url}/metrics").text
    assert metric(scraped, 'refund_agent_refunds_total{outcome="completed"}') == 50
    assert metric(scraped, 'refund_agent_queue_depth{queue="refunds",status="ENQUEUED"}') == 0


@postgres_only
@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_survivors_racing_to_recover_one_dead_executor_run_every_step_once(
    env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    env.sandbox.set_faults(latency_ms=3000)  # six refunds in the middle of their payment call
    doomed = cluster.worker("worker-d", QUEUE_WORKER_CONCURRENCY="8")
    in_flight = [f"racing-{i}" for i in range(6)]
    request = RefundRequest(order_id="ord_1001", message="Please refund 1.00", amount=Decimal("1.00"))
    for refund_id in in_flight:
        submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)
    wait_for(lambda: _rows_paying(in_flight), timeout=120, what="six refunds reserved and calling the provider")
    doomed.send_signal(signal.SIGKILL)
    wait_for(doomed.poll, timeout=30, what="worker-d to die")
    assert {w.status for w in cluster.statuses(in_flight).values()} == {"PENDING"}

    # Eight would-be recoverers in this process, all at once, at both layers: our lease compare-and-set
    # followed by DBOS.resume_workflow, and DBOS's own recovery of an executor's pending workflows.
    settings = env.settings(refund_agent_executor_id="racer", executor_heartbeat_seconds=3600.0)
    rt = runtime.start(settings, worker=False, freeze_heap=False)
    try:
        assert rt.lease is not None and rt.heartbeat is not None
        lease, engine = rt.lease, rt.heartbeat.engine
        wait_for(lambda: _stale(cluster, "worker-d", 5.0), timeout=30, what="worker-d's lease to go stale")
        winners: list[dict[str, int]] = []
        barrier = threading.Barrier(8)

        def ours() -> None:
            barrier.wait()
            winners.append(
                heartbeat.recover_dead_executors(engine, lease, stale_after=5.0, fallback_queue=APPROVAL_QUEUE)
            )

        def dbos_own() -> None:
            barrier.wait()
            DBOS._recover_pending_workflows(["worker-d"])

        threads = [threading.Thread(target=f) for f in [ours] * 4 + [dbos_own] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # One sweeper took the dead executor's lease (and resumed what DBOS's own recovery had not moved yet);
        # the other three found nothing to take.
        assert sum("worker-d" in w for w in winners) == 1
        assert {w.status for w in cluster.statuses(in_flight).values()} == {"ENQUEUED"}
        assert cluster.leases()["worker-d"].state == heartbeat.RECOVERED
        env.sandbox.set_faults(latency_ms=0)
        cluster.worker("survivor-1")
        cluster.worker("survivor-2")
        final = cluster.wait_done(in_flight)
        assert {w.executor_id for w in final.values()} <= {"survivor-1", "survivor-2"}
        assert_paid_once_each(env, cluster, dict.fromkeys(in_flight, "ord_1001"))
        registry = metrics.api_registry(app_db().engine, cluster.client, runtime.QUEUES)
        assert metric(generate_latest(registry).decode(), 'refund_agent_refunds_total{outcome="completed"}') == 6
    finally:
        runtime.stop()


def _rows_paying(refund_ids: list[str]) -> bool:
    """Every refund reserved its amount: the next thing each does is the (slow) payment call."""
    with app_db().engine.connect() as conn:
        statuses = conn.execute(sa.select(refunds.c.status).where(refunds.c.refund_id.in_(refund_ids))).scalars()
        return sorted(statuses) == ["paying"] * len(refund_ids)


def _stale(cluster: Cluster, executor_id: str, stale_after: float) -> bool:
    with app_db().engine.connect() as conn:
        now = db_now_ms(conn)
        beat = conn.execute(
            sa.select(executor_leases.c.beat_ms).where(executor_leases.c.executor_id == executor_id)
        ).scalar_one()
    return bool(now - beat > stale_after * 1000)


def test_sigterm_finishes_the_step_in_flight_and_takes_no_new_work(env: Env, cluster: Cluster) -> None:
    env.sandbox.set_faults(latency_ms=3000)
    worker = cluster.worker("draining", SHUTDOWN_TIMEOUT_SECONDS="60")
    request = RefundRequest(order_id="ord_1001", message="Please refund 5.00", amount=Decimal("5.00"))
    submit_refund(
        cluster.client, idempotency_key="in-flight-1", requester=HELPDESK, request=request, app_version="0.1.0"
    )
    wait_for(lambda: env.sandbox.stats().get("create_requests", 0) >= 1, timeout=90, what="the payment call")

    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping: no new refunds" in cluster.log("draining"), timeout=30, what="the drain to begin")
    submit_refund(
        cluster.client, idempotency_key="after-term-1", requester=HELPDESK, request=request, app_version="0.1.0"
    )
    assert wait_for(worker.poll, timeout=90, what="the worker to exit") == 0

    statuses = cluster.statuses(["in-flight-1", "after-term-1"])
    assert statuses["in-flight-1"].status == "SUCCESS"
    assert statuses["after-term-1"].status == "ENQUEUED"
    assert cluster.leases()["draining"].state == heartbeat.STOPPED
    env.sandbox.set_faults(latency_ms=0)
    cluster.worker("draining-next")
    cluster.wait_done(["after-term-1"])
    assert_paid_once_each(env, cluster, {"in-flight-1": "ord_1001", "after-term-1": "ord_1001"})


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_worker_counts_payment_retries_on_its_metrics_port(env: Env, cluster: Cluster) -> None:
    from agent.ops.processes import free_port

    port = free_port()
    env.sandbox.set_faults(fail_next=2)
    cluster.worker("retrying", REFUND_AGENT_METRICS_PORT=str(port))
    request = RefundRequest(order_id="ord_1001", message="Please refund 5.00", amount=Decimal("5.00"))
    submit_refund(cluster.client, idempotency_key="retried-1", requester=HELPDESK, request=request, app_version="0.1.0")
    cluster.wait_done(["retried-1"])

    assert_paid_once_each(env, cluster, {"retried-1": "ord_1001"})
    scraped = web.get(f"http://127.0.0.1:{port}/metrics").text
    assert metric(scraped, "refund_agent_payment_retries_total") == 2


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_metrics_endpoint_wants_the_token_when_one_is_set(env: Env, cluster: Cluster) -> None:
    scrape_token = "scrape-secret-at-least-32-bytes-long"
    cluster.api(METRICS_TOKEN=scrape_token)
    assert cluster.api_url is not None
    assert web.get(f"{cluster.api_url}/metrics").status_code == 401
    assert web.get(f"{cluster.api_url}/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 401
    ok = web.get(f"{cluster.api_url}/metrics", headers={"Authorization": f"Bearer {scrape_token}"})
    assert ok.status_code == 200
    assert metric(ok.text, "refund_agent_parked_approvals") == 0


@postgres_only
@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_queue_rate_limit_holds_refunds_beyond_the_limit_on_the_queue(env: Env, cluster: Cluster) -> None:
    cluster.worker("limited", QUEUE_RATE_LIMIT_PER_MINUTE="2")
    ids = [f"limited-{i}" for i in range(4)]
    request = RefundRequest(order_id="ord_1001", message="Please refund 1.00", amount=Decimal("1.00"))
    for refund_id in ids:
        submit_refund(
            cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request, app_version="0.1.0"
        )

    def two_done() -> dict[str, str] | None:
        found = {r: w.status for r, w in cluster.statuses(ids).items()}
        return found if sorted(found.values()).count("SUCCESS") == 2 else None

    statuses = wait_for(two_done, timeout=90, what="two refunds to complete")
    # The window is a minute long: the other two wait on the queue, not started, until it rolls over.
    assert sorted(statuses.values()) == ["ENQUEUED", "ENQUEUED", "SUCCESS", "SUCCESS"]
    assert all(w.dequeued_at is None for w in cluster.statuses(ids).values() if w.status == "ENQUEUED")


def test_two_processes_starting_at_once_with_one_id_one_runs_and_one_is_refused(env: Env, cluster: Cluster) -> None:
    first = cluster.start("twin-1", ["worker"], REFUND_AGENT_EXECUTOR_ID="twin")
    second = cluster.start("twin-2", ["worker"], REFUND_AGENT_EXECUTOR_ID="twin")

    def one_exited() -> list[int | None] | None:
        codes = [first.poll(), second.poll()]
        return codes if codes.count(None) == 1 else None

    codes = wait_for(one_exited, timeout=90, what="one of the twins to exit")
    assert sorted(codes, key=lambda c: c is None) == [3, None]
    survivor = first if first.poll() is None else second
    cluster.wait_running("twin-1" if survivor is first else "twin-2", survivor)
    assert cluster.leases()["twin"].pid == survivor.pid


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_sigterm_stops_the_api_in_bounded_time_while_a_client_stalls_mid_request(env: Env, cluster: Cluster) -> None:
    """A client that sent half a request (a slow or stuck one) must not hold the API past its grace period: uvicorn
    gives open requests HTTP_SHUTDOWN_TIMEOUT_SECONDS, then the drain goes on and the process exits 0."""
    proc = cluster.api("stalling")
    assert cluster.api_url is not None
    port = int(cluster.api_url.rsplit(":", 1)[1])
    head = (
        "POST /refunds HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
        f"Authorization: Bearer {API_TOKEN}\r\nIdempotency-Key: stalled-1\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        stalled.sendall(head.encode() + b'{"order_id": ')  # and never the rest of the body
        time.sleep(1.0)  # the request is in the app, reading its body
        proc.send_signal(signal.SIGTERM)
        code = wait_for(proc.poll, timeout=60, what="the API to exit with a request stalled mid-body")
    assert code == 0
    assert "refund-agent stopped" in cluster.log("stalling")
