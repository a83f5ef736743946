"""Money invariants as properties: whatever the requests, decisions and crashes, no order is over-refunded
and no refund request pays twice.

Two layers. The policy layer, in memory: refunds decided on an order, then re-checked by ``agent.policy``
on the order as the payment step reads it after a wait (refunded by hand, disputed, out of the window by
then), hundreds of generated cases.
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
from hypothesis import HealthCheck, Phase, assume, event, find, given, settings
from hypothesis import strategies as st

from agent import approvals, policy, runtime
from agent.domain import RefundRequest, Verdict
from agent.ops.checkpoints import SERIALIZER
from agent.ops.processes import child_env, spawn, stop, wait_for
from agent.status import parked, wait_for_outcome
from agent.submit import SubmissionError, submit_refund
from steps import audit
from steps.records import Order, OrderSnapshot, from_minor
from steps.seed import ORDERS, seed
from steps.store import app_db, close_app_database, open_app_database
from tests.conftest import Env, SandboxServer, make_databases
from tests.evidence_server import EvidenceServer
from tests.identities import DANA, HELPDESK

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


@dataclass(frozen=True)
class Meanwhile:
    """What happens to an order while a refund decided on it waits to be paid (for a person, or a retry)."""

    refunded_by_hand: Decimal
    days: int
    disputed: bool

    def applied_to(self, order: Order) -> Order:
        by_hand = min(self.refunded_by_hand, max(order.remaining, Decimal(0)))
        return order.model_copy(
            update={
                "amount_refunded": order.amount_refunded + by_hand,
                "status": "disputed" if self.disputed else order.status,
            }
        )


meanwhile = st.builds(
    Meanwhile,
    refunded_by_hand=st.one_of(st.just(Decimal(0)), st.decimals(min_value=0, max_value=Decimal("9000"), places=2)),
    days=st.one_of(st.integers(0, 3), st.integers(50, 70)),
    disputed=st.sampled_from([False, False, False, True]),
)


def recheck(amount: Decimal, payment_time: OrderSnapshot) -> Verdict:
    """Policy again, on the order as the payment step reads it (``PaymentPlan.snapshot``)."""
    return policy.decide(
        amount=amount, currency="USD", order=payment_time.order, as_of=payment_time.as_of, limits=LIMITS
    )


def still_allowed(amount: Decimal, payment_time: OrderSnapshot) -> bool:
    """The money rules at payment time, restated without ``agent.policy``: paid, in the window, room left."""
    order = payment_time.order
    assert order.paid_at is not None
    in_window = payment_time.as_of - order.paid_at < timedelta(days=LIMITS.window_days + 1)
    return order.status == "paid" and in_window and amount <= order.remaining


@st.composite
def allowed_at_decision(draw: st.DrawFn) -> tuple[Order, Decimal]:
    """A paid order inside the window and an amount it has room for: policy pays it (at once or once approved)."""
    order = draw(orders()).model_copy(
        update={"status": "paid", "paid_at": NOW - timedelta(days=draw(st.integers(0, LIMITS.window_days)))}
    )
    assume(order.remaining > 0)
    top = min(order.remaining, LIMITS.absolute_cap)
    small = st.decimals(min_value=Decimal("0.01"), max_value=min(top, LIMITS.auto_approve), places=2)
    large = st.decimals(min_value=LIMITS.auto_approve + Decimal("0.01"), max_value=top, places=2)
    amount = draw(small if top <= LIMITS.auto_approve else st.one_of(small, large))
    return order, amount


@settings(max_examples=400, derandomize=True, deadline=None)
@given(decided=allowed_at_decision(), later=meanwhile)
def test_the_recheck_before_paying_refuses_what_the_order_no_longer_allows(
    decided: tuple[Order, Decimal], later: Meanwhile
) -> None:
    order, amount = decided
    decision = policy.decide(amount=amount, currency="USD", order=order, as_of=NOW, limits=LIMITS)
    assert decision.kind != "refuse", decision.reasons
    payment_time = OrderSnapshot(order=later.applied_to(order), as_of=NOW + timedelta(days=later.days))
    again = recheck(amount, payment_time)
    event(f"re-check: {again.kind}")
    assert (again.kind != "refuse") == still_allowed(amount, payment_time), again.reasons
    assert again.kind == "refuse" or again.kind == decision.kind  # nothing else changed: same amount, same limits


CHANGED = {
    "refunded by hand meanwhile": (Meanwhile(Decimal("460.00"), 0, False), "exceeds the refundable 40.00 USD"),
    "the window closed meanwhile": (Meanwhile(Decimal(0), 3, False), "outside the 60-day refund window"),
    "disputed meanwhile": (Meanwhile(Decimal(0), 0, True), "the order is disputed"),
}


@pytest.mark.parametrize(("later", "why"), CHANGED.values(), ids=CHANGED.keys())
def test_a_refund_allowed_when_decided_is_refused_at_payment_when_the_order_changed(later: Meanwhile, why: str) -> None:
    order = Order(
        order_id="ord_prop", customer_id="cus_prop", customer_name="P", currency="USD",
        amount_captured=Decimal("500.00"), amount_refunded=Decimal(0), status="paid",
        paid_at=NOW - timedelta(days=58), charge_id="ch_prop", items=[],
    )  # fmt: skip
    decision = policy.decide(amount=Decimal("50.00"), currency="USD", order=order, as_of=NOW, limits=LIMITS)
    assert decision.kind == "auto_approve"
    payment_time = OrderSnapshot(order=later.applied_to(order), as_of=NOW + timedelta(days=later.days))
    again = recheck(Decimal("50.00"), payment_time)
    assert again.kind == "refuse" and any(why in reason for reason in again.reasons), again.reasons
    unchanged = recheck(Decimal("50.00"), OrderSnapshot(order=order, as_of=NOW + timedelta(days=2)))
    assert unchanged.kind == "auto_approve"


Waiting = list[tuple[Decimal, bool, Meanwhile]]
waiting = st.lists(st.tuples(amounts, st.booleans(), meanwhile), min_size=1, max_size=8)


def settle(order: Order, refunds: Waiting, *, recheck_at_payment: bool = True) -> list[str]:
    """Refunds on one order are decided together on the order as it is now, and wait (for a person, for a
    retry) while the order changes; then each is paid in turn, after policy's re-check on the order as the
    payment step reads it. Returns the money rules broken by what was paid."""
    decided = [
        (amount, approves, later, policy.decide(amount=amount, currency="USD", order=order, as_of=NOW, limits=LIMITS))
        for amount, approves, later in refunds
    ]
    broken: list[str] = []
    now = NOW
    for amount, person_approves, later, verdict in decided:
        order, now = later.applied_to(order), now + timedelta(days=later.days)
        if not (verdict.kind == "auto_approve" or (verdict.kind == "needs_approval" and person_approves)):
            continue
        if recheck_at_payment and recheck(amount, OrderSnapshot(order=order, as_of=now)).kind == "refuse":
            continue
        if not still_allowed(amount, OrderSnapshot(order=order, as_of=now)):
            broken.append(f"paid {amount} on {order.status} order with {order.remaining} left at day {now - NOW}")
        if verdict.kind == "auto_approve" and amount > LIMITS.auto_approve:
            broken.append(f"paid {amount} without a person, above the auto-approve limit")
        if amount > LIMITS.absolute_cap or amount <= 0:
            broken.append(f"paid {amount}, outside (0, cap]")
        order = order.model_copy(update={"amount_refunded": order.amount_refunded + amount})
        if order.amount_refunded > order.amount_captured:
            broken.append(f"refunded {order.amount_refunded} of {order.amount_captured} captured")
    return broken


@settings(max_examples=400, derandomize=True, deadline=None)
@given(order=orders(), refunds=waiting)
def test_refunds_decided_together_and_paid_one_by_one_never_break_the_money_rules(
    order: Order, refunds: Waiting
) -> None:
    assert settle(order, refunds) == []


def test_paying_on_the_decision_alone_would_break_the_money_rules() -> None:
    """The property above can fail: without the re-check on the payment-time order it finds a broken rule."""
    order, refunds = find(
        st.tuples(orders(), waiting),
        lambda example: bool(settle(*example, recheck_at_payment=False)),
        settings=settings(derandomize=True, database=None, max_examples=2000, phases=[Phase.generate]),
    )
    assert settle(order, refunds) == []


# -- the request's bound ------------------------------------------------------------------------------

any_limits = st.builds(
    policy.Limits,
    auto_approve=st.one_of(st.just(Decimal("100.00")), st.decimals(min_value=0, max_value=Decimal("2000"), places=2)),
    absolute_cap=st.one_of(
        st.just(Decimal("10000.00")), st.decimals(min_value=0, max_value=Decimal("12000"), places=2)
    ),
    window_days=st.one_of(st.just(60), st.integers(0, 90)),
)


@st.composite
def mostly_refundable_orders(draw: st.DrawFn) -> Order:
    """Orders as ``orders`` makes them, but most of them paid, in the window and with room left."""
    order = draw(orders())
    if draw(st.integers(0, 4)) == 0:
        return order
    refunded = draw(st.sampled_from([Decimal(0), Decimal(0), order.amount_refunded]))
    days = draw(st.integers(0, 60))
    return order.model_copy(
        update={"status": "paid", "amount_refunded": refunded, "paid_at": NOW - timedelta(days=days)}
    )


def bounded_cases() -> st.SearchStrategy[tuple[Order, tuple[Decimal | None, Decimal]]]:
    return mostly_refundable_orders().flatmap(lambda order: st.tuples(st.just(order), requests_and_proposals(order)))


@st.composite
def requests_and_proposals(draw: st.DrawFn, order: Order) -> tuple[Decimal | None, Decimal]:
    """What the customer asks for (None: no amount named; else positive, in minor units, at most what was paid, as
    submission requires) and what a model proposes: often the whole order or more than asked, sometimes anything."""
    cents = Decimal("0.01")
    small = min(order.amount_captured, Decimal("150.00"))
    requested = draw(
        st.one_of(
            st.none(),
            st.decimals(min_value=cents, max_value=small, places=2),
            st.decimals(min_value=cents, max_value=order.amount_captured, places=2),
        )
    )
    anchors = [order.amount_captured, order.remaining, min(order.remaining, Decimal("100.00")), Decimal("10000.01")]
    if requested is not None:
        anchors += [requested, requested + cents, requested * 2]
    proposed = draw(
        st.one_of(
            st.sampled_from(anchors),
            st.decimals(min_value=cents, max_value=max(order.remaining, cents), places=2),
            amounts,
            st.decimals(min_value=Decimal("-1"), max_value=Decimal("12000"), places=3),  # sub-cent amounts too
        )
    )
    return requested, proposed


def payable_above_the_request(verdict: Verdict, requested: Decimal | None) -> list[str]:
    """The request's bound, restated without ``agent.policy``: what a verdict could pay above what was asked."""
    if requested is None or verdict.amount <= requested:
        return []
    if verdict.kind == "auto_approve":
        return [f"auto-approved {verdict.amount}, more than the {requested} asked for"]
    if verdict.kind == "needs_approval":
        return [f"a person is asked to approve {verdict.amount}, more than the {requested} asked for"]
    return []


@settings(max_examples=500, derandomize=True, deadline=None)
@given(
    case=bounded_cases(),
    limits=any_limits,
    currency=st.sampled_from(["USD", "USD", "USD", "EUR"]),
)
def test_no_verdict_that_can_lead_to_a_payment_is_above_the_requested_amount(
    case: tuple[Order, tuple[Decimal | None, Decimal]], limits: policy.Limits, currency: str
) -> None:
    order, (requested, proposed) = case
    verdict = policy.decide(
        amount=proposed, currency=currency, order=order, as_of=NOW, limits=limits, requested=requested
    )
    over = requested is not None and proposed > requested
    event(f"{verdict.kind}, {'over the request' if over else 'within it'}")
    assert payable_above_the_request(verdict, requested) == []
    if over:  # never paid at once; a person is asked for the requested amount, or it is refused
        assert verdict.kind != "auto_approve" and verdict.amount == requested
        assert any("more than the" in reason and "the customer asked for" in reason for reason in verdict.reasons)
    if verdict.kind == "refuse":
        return
    room = policy.refundable(order, NOW, limits.window_days)
    assert Decimal(0) < verdict.amount <= min(room, limits.absolute_cap)
    if verdict.kind == "auto_approve":
        assert verdict.amount == proposed and verdict.amount <= limits.auto_approve
    # What a person approves (the verdict's amount) passes the re-check before paying on the unchanged order...
    payment = OrderSnapshot(order=order, as_of=NOW)
    again = policy.recheck(
        amount=verdict.amount, currency=currency, order=payment.order, as_of=NOW, limits=limits, requested=requested
    )
    assert again.kind != "refuse", again.reasons
    # ... and any amount above the request does not, whatever was approved.
    if requested is not None:
        above = policy.recheck(
            amount=max(proposed, requested + Decimal("0.01")), currency=currency, order=payment.order, as_of=NOW,
            limits=limits, requested=requested,
        )  # fmt: skip
        assert above.kind == "refuse"


def test_without_the_requested_bound_policy_would_auto_approve_more_than_was_asked() -> None:
    """The property above can fail: policy judging the model's amount alone auto-approves more than was asked."""

    def unbounded(example: tuple[Order, tuple[Decimal | None, Decimal]]) -> bool:
        order, (requested, proposed) = example
        verdict = policy.decide(amount=proposed, currency="USD", order=order, as_of=NOW, limits=LIMITS)
        return bool(payable_above_the_request(verdict, requested))

    order, (requested, proposed) = find(
        bounded_cases(),
        unbounded,
        settings=settings(derandomize=True, database=None),
    )
    assert requested is not None and proposed > requested
    bounded = policy.decide(amount=proposed, currency="USD", order=order, as_of=NOW, limits=LIMITS, requested=requested)
    assert payable_above_the_request(bounded, requested) == []


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
    """A worker process on fresh SQLite databases, with the payments and evidence sandboxes in this process."""

    def __init__(self, root: Path) -> None:
        self.sandbox = SandboxServer(f"sqlite:///{root}/sandbox.sqlite")
        self.evidence = EvidenceServer()  # the look-ups policy wants before paying at once
        self.env = Env("sqlite", make_databases("sqlite", root), root / "data", self.sandbox, self.evidence)
        settings_ = self.env.settings()
        audit.use_key(settings_.audit_key())
        runtime.migrate_databases(settings_)
        open_app_database(settings_.database.app_database_url)
        seed(app_db().engine)
        self.client = DBOSClient(system_database_url=self.env.dbs.system_url, serializer=SERIALIZER)
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
        self.evidence.stop()


def _play(svc: Service, steps: list[Step], kill_after: int, crash_at: str | None) -> dict[str, Step]:
    svc.launch(crash_at)
    accepted: dict[str, Step] = {}
    for i, step in enumerate(steps):
        if i == kill_after:
            svc.kill()
        key = f"prop-{i:02d}-{step.order_id}"
        request = RefundRequest(order_id=step.order_id, message="Please refund.", amount=step.amount)
        try:
            submit_refund(svc.client, idempotency_key=key, requester=HELPDESK, request=request, app_version="0.1.0")
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
                    approvals.decide_pending(run, refund_id=key, decision=decision, approver=DANA, via="console")
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
