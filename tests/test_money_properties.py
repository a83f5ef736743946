"""Money invariants as properties: whatever the requests, decisions and crashes, no order is over-refunded
and no refund request pays twice.

Two layers. The policy layer runs hundreds of generated sequences through ``agent.policy`` in memory.
The service layer generates a schedule (refund requests on a few orders, several on the same order,
approvals and rejections, a worker armed to die at a crash point, a SIGKILL after the k-th submission)
and plays it against a real worker process on real SQLite with the real payments sandbox, then checks
the provider's ledger. Examples are derandomized, so CI runs the same schedules every time.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOSClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import approvals, policy, runtime
from agent.domain import RefundRequest
from agent.processes import child_env, spawn, stop, wait_for
from agent.status import parked, wait_for_outcome
from agent.submit import SubmissionError, submit_refund
from steps import audit
from steps.records import Order, from_minor
from steps.seed import ORDERS, seed
from steps.store import app_db, close_app_database, open_app_database
from tests.conftest import Env, SandboxServer, make_databases

LIMITS = policy.Limits(auto_approve=Decimal("100.00"), absolute_cap=Decimal("10000.00"), window_days=60)
NOW = datetime(2026, 11, 1, tzinfo=UTC)

amounts = st.decimals(min_value=Decimal("-5"), max_value=Decimal("12000"), places=2, allow_nan=False)


@st.composite
def orders(draw: st.DrawFn) -> Order:
    captured = draw(st.decimals(min_value=Decimal("0.01"), max_value=Decimal("9000"), places=2))
    refunded = draw(st.decimals(min_value=Decimal("0"), max_value=captured, places=2))
    return Order(
        order_id="ord_prop",
        customer_id="cus_prop",
        customer_name="P",
        currency="USD",
        amount_captured=captured,
        amount_refunded=refunded,
        status=draw(st.sampled_from(["paid", "paid", "paid", "disputed", "unpaid"])),
        paid_at=NOW - timedelta(days=draw(st.integers(0, 90))),
        charge_id="ch_prop",
        items=[],
    )


@settings(max_examples=400, derandomize=True, deadline=None)
@given(order=orders(), proposals=st.lists(st.tuples(amounts, st.booleans()), min_size=1, max_size=8))
def test_policy_never_lets_an_order_be_refunded_beyond_what_was_captured(
    order: Order, proposals: list[tuple[Decimal, bool]]
) -> None:
    """Any sequence of proposals (each approved by a person or not), each re-checked before paying."""
    for amount, person_approves in proposals:
        verdict = policy.decide(amount=amount, currency="USD", order=order, as_of=NOW, limits=LIMITS)
        pays = verdict.kind == "auto_approve" or (verdict.kind == "needs_approval" and person_approves)
        if not pays:
            continue
        recheck = policy.decide(amount=amount, currency="USD", order=order, as_of=NOW, limits=LIMITS)
        assert recheck.kind != "refuse"
        assert 0 < amount <= order.remaining and amount <= LIMITS.absolute_cap
        assert verdict.kind == "needs_approval" or amount <= LIMITS.auto_approve
        order = order.model_copy(update={"amount_refunded": order.amount_refunded + amount})
        assert order.amount_refunded <= order.amount_captured


# -- the service layer -------------------------------------------------------------------------------

CAPTURED = {o[0]: (Decimal(o[3]), Decimal(o[4])) for o in ORDERS}  # order -> (captured, refunded at seed)
SCHEDULE_ORDERS = ["ord_1001", "ord_1002", "ord_1003", "ord_1010"]


@dataclass(frozen=True)
class Step:
    order_id: str
    amount: Decimal | None
    decision: str | None  # what the approver answers if the refund parks; None: nobody answers


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[Step], int, str | None]:
    steps = draw(
        st.lists(
            st.builds(
                Step,
                order_id=st.sampled_from(SCHEDULE_ORDERS),
                amount=st.one_of(st.none(), st.sampled_from([Decimal("10.00"), Decimal("40.00"), Decimal("150.00")])),
                decision=st.sampled_from(["approve", "approve", "reject", None]),
            ),
            min_size=2,
            max_size=5,
        )
    )
    kill_after = draw(st.integers(min_value=0, max_value=len(steps)))
    crash_at = draw(
        st.sampled_from(
            [None, "before_provider_call", "after_provider_call", "after_decision_recorded", "after_approval_received"]
        )
    )
    return steps, kill_after, crash_at


class Service:
    """A worker process on fresh SQLite databases, with the sandbox in this process."""

    def __init__(self, root: Path) -> None:
        self.sandbox = SandboxServer(f"sqlite:///{root}/sandbox.sqlite")
        self.env = Env("sqlite", make_databases("sqlite", root), root / "data", self.sandbox)
        settings_ = self.env.settings()
        runtime.migrate_databases(settings_)
        open_app_database(settings_.app_database_url)
        seed(app_db().engine)
        self.client = DBOSClient(system_database_url=self.env.dbs.system_url)
        self.vars = child_env(self.env.env_vars(), drop=("REFUND_AGENT_CRASH_AT", "REFUND_AGENT_MODEL"))
        self.logs = root / "logs"
        self.worker: subprocess.Popen[bytes] | None = None

    def launch(self, crash_at: str | None = None) -> None:
        extra = {"REFUND_AGENT_CRASH_AT": crash_at} if crash_at else {}
        self.worker = spawn(["worker"], env={**self.vars, **extra}, log=self.logs / "worker.log")

    def kill(self) -> None:
        assert self.worker is not None
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGKILL)
            self.worker.wait(30)
        self.launch()

    def keep_alive(self) -> None:
        """A worker that died at its crash point comes back (same executor id), unarmed."""
        if self.worker is not None and self.worker.poll() is not None:
            self.launch()

    def ended(self, refund_id: str) -> bool:
        try:
            wait_for_outcome(self.client, refund_id, timeout=0)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self.worker is not None:
            stop(self.worker)
        self.client.destroy()
        close_app_database()
        self.sandbox.close()


def _play(svc: Service, steps: list[Step], kill_after: int, crash_at: str | None) -> dict[str, Step]:
    svc.launch(crash_at)
    accepted: dict[str, Step] = {}
    for i, step in enumerate(steps):
        if i == kill_after:
            svc.kill()
        key = f"prop-{i:02d}-{step.order_id}"
        request = RefundRequest(order_id=step.order_id, message="Please refund.", amount=step.amount)
        try:
            submit_refund(svc.client, idempotency_key=key, request=request, app_version="0.1.0")
        except SubmissionError:
            continue  # e.g. more than the order's captured amount: refused before anything starts
        accepted[key] = step
    if kill_after == len(steps):
        svc.kill()

    def settled() -> bool:
        svc.keep_alive()
        done = True
        for key, step in accepted.items():
            if svc.ended(key):
                continue
            pending = parked(svc.client, key)
            if pending is not None and step.decision is not None:
                decision: Any = step.decision
                run = approvals.decider_via_queue(svc.client, timeout=0)  # the worker records it when it can
                with contextlib.suppress(approvals.ApprovalError):  # e.g. queued, an expiry, or already decided
                    approvals.decide_pending(run, refund_id=key, decision=decision, approver="prop")
            if pending is None or step.decision is not None:
                done = False
        return done

    wait_for(settled, timeout=150, what="every refund to finish or park", interval=0.3)
    return accepted


@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schedule=schedules())
def test_any_schedule_of_requests_decisions_and_crashes_pays_each_request_at_most_once(
    tmp_path_factory: pytest.TempPathFactory, schedule: tuple[list[Step], int, str | None]
) -> None:
    steps, kill_after, crash_at = schedule
    svc = Service(tmp_path_factory.mktemp("prop"))
    try:
        accepted = _play(svc, steps, kill_after, crash_at)
        ledger = svc.sandbox.refunds()
        by_request: dict[str, int] = {}
        per_order: dict[str, Decimal] = {}
        for row in ledger:
            meta = row["metadata"]
            by_request[meta["refund_id"]] = by_request.get(meta["refund_id"], 0) + 1
            amount = from_minor(int(row["amount"]), str(row["currency"]).upper())
            per_order[meta["order_id"]] = per_order.get(meta["order_id"], Decimal(0)) + amount
        assert all(count == 1 for count in by_request.values()), by_request  # each request pays at most once
        assert set(by_request) <= set(accepted)
        for order_id, paid in per_order.items():
            captured, refunded_before = CAPTURED[order_id]
            assert refunded_before + paid <= captured, (order_id, paid, steps)
        with app_db().engine.connect() as conn:
            assert audit.verify(conn).ok
    except BaseException:
        print((svc.logs / "worker.log").read_text()[-3000:] if (svc.logs / "worker.log").exists() else "")
        raise
    finally:
        svc.close()
