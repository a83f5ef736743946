"""The chaos soak: seeded plans, a judge that catches each kind of violation, and a small real run.

The small run is what CI runs: 40 refunds through a real `serve` and a worker on Postgres (SQLite when
the Postgres half is off), 5 SIGKILLs at seeded moments, payment 500s, latency and lost responses.
With REFUND_AGENT_CHAOS_PG_CLUSTER (``VERSION/NAME``) and REFUND_AGENT_CHAOS_POSTGRES_URL naming a
private local cluster, the run also restarts that Postgres cluster once; without them the restart's own
test is skipped with the reason (REFUND_AGENT_CHAOS_PG_UNAVAILABLE when .ci/pg-chaos-cluster gave one).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from proving.chaos import ChaosConfig, run_chaos
from proving.chaos.evidence import CLAIM_MESSAGES, evidence_seed
from proving.chaos.plan import CRASH_POINTS, MESSAGES, Limits, expected_outcome, make_plan
from proving.chaos.verdict import Observed, judge
from sandbox.claims import classify, tools_for
from steps.faults import CRASH_POINTS as KNOWN_CRASH_POINTS
from steps.records import to_minor
from tests.conftest import PG_SERVER

OK_AUDIT = {"ok": True, "entries": 1}
PRIVATE_CLUSTER = os.environ.get("REFUND_AGENT_CHAOS_PG_CLUSTER")
PRIVATE_URL = os.environ.get("REFUND_AGENT_CHAOS_POSTGRES_URL")
NO_PRIVATE_CLUSTER = os.environ.get(
    "REFUND_AGENT_CHAOS_PG_UNAVAILABLE",
    "REFUND_AGENT_CHAOS_PG_CLUSTER and REFUND_AGENT_CHAOS_POSTGRES_URL are unset (.ci/pg-chaos-cluster sets them)",
)


def test_same_seed_gives_the_same_workload_and_fault_schedule() -> None:
    one = make_plan(seed=7, refunds=60, kills=8, workers=2, pg_restart=True)
    again = make_plan(seed=7, refunds=60, kills=8, workers=2, pg_restart=True)
    other = make_plan(seed=8, refunds=60, kills=8, workers=2, pg_restart=True)
    assert one == again and one.fingerprint() == again.fingerprint()
    assert one.kills != other.kills and one.fingerprint() != other.fingerprint()
    assert len(one.kills) == 8 and one.pg_restart_after is not None
    assert {p.expected for p in one.refunds} == {"completed", "rejected", "awaiting_approval"}
    assert any(p.second_decision == "same" for p in one.refunds)
    assert any(p.second_decision == "opposite" for p in one.refunds)


def test_expected_outcomes_restate_the_money_rules() -> None:
    plan = make_plan(seed=1, refunds=1, kills=0, workers=1, pg_restart=False)
    base = replace(plan.refunds[0], captured=Decimal("500.00"), refunded=Decimal(0), amount=None, decision=None)
    limits = Limits()
    assert expected_outcome(replace(base, amount=Decimal("99.99")), limits) == ("completed", Decimal("99.99"))
    assert expected_outcome(base, limits) == ("awaiting_approval", Decimal(0))
    assert expected_outcome(replace(base, decision="approve"), limits) == ("completed", Decimal("500.00"))
    assert expected_outcome(replace(base, decision="reject"), limits) == ("rejected", Decimal(0))
    assert expected_outcome(replace(base, order_status="disputed"), limits)[0] == "rejected"
    assert expected_outcome(replace(base, days_since_payment=61), limits)[0] == "rejected"
    assert expected_outcome(replace(base, refunded=Decimal(400), amount=Decimal(200)), limits)[0] == "rejected"
    assert expected_outcome(replace(base, captured=Decimal(10001)), limits)[0] == "rejected"


def test_investigating_refunds_claim_a_lost_parcel_the_carrier_can_answer_for() -> None:
    plan = make_plan(seed=7, refunds=200, kills=0, workers=1, pg_restart=False)
    investigating = [p for p in plan.refunds if p.carrier_says is not None]
    assert {p.carrier_says for p in investigating} == {"return_to_sender", "in_transit"}
    assert {p.expected for p in investigating} >= {"completed", "rejected"}
    assert "approve" in {p.decision for p in investigating if p.carrier_says == "return_to_sender"}  # over the limit
    assert all(p.expected == "rejected" for p in investigating if p.carrier_says == "in_transit")
    for message in CLAIM_MESSAGES:  # read as "never arrived", needing the carrier's tracking and nothing else
        assert classify(message) == "not_received" and tools_for(message) == ("track_shipment",), message
    for message in (*CLAIM_MESSAGES, *MESSAGES):  # a digit would be read as the amount asked for
        assert not any(c.isdigit() for c in message), message
    assert all(tools_for(message) == () for message in MESSAGES)  # the others are decided without a look-up
    trackers = {(t["carrier"], t["tracking_code"]): t["status"] for t in evidence_seed(plan.refunds)["trackers"]}
    assert trackers == {(p.carrier, p.tracking_code): p.carrier_says for p in investigating}
    assert all(not p.tracking_code for p in plan.refunds if p.carrier_says is None)
    # One customer per refund: the serial-claimant rule never sees another planned refund of the same customer.
    assert len({p.customer_id for p in plan.refunds}) == len(plan.refunds)
    assert set(CRASH_POINTS) <= KNOWN_CRASH_POINTS and "after_carrier_answered" in CRASH_POINTS


def test_a_parcel_in_transit_is_refused_and_one_returned_to_sender_follows_the_money_rules() -> None:
    plan = make_plan(seed=1, refunds=1, kills=0, workers=1, pg_restart=False)
    base = replace(plan.refunds[0], captured=Decimal("500.00"), refunded=Decimal(0), amount=None, decision=None)
    limits = Limits()
    moving, back = replace(base, carrier_says="in_transit"), replace(base, carrier_says="return_to_sender")
    assert expected_outcome(replace(moving, amount=Decimal("20.00")), limits) == ("rejected", Decimal(0))
    assert expected_outcome(replace(moving, decision="approve"), limits) == ("rejected", Decimal(0))
    assert expected_outcome(replace(back, amount=Decimal("20.00")), limits) == ("completed", Decimal("20.00"))
    assert expected_outcome(back, limits) == ("awaiting_approval", Decimal(0))
    assert expected_outcome(replace(back, decision="approve"), limits) == ("completed", Decimal("500.00"))
    assert expected_outcome(replace(back, order_status="disputed"), limits)[0] == "rejected"


def _clean_evidence(seed: int = 5) -> tuple[Any, dict[str, Observed], list[dict[str, Any]]]:
    """A plan and the evidence a correct service would leave for it."""
    plan = make_plan(seed=seed, refunds=30, kills=0, workers=1, pg_restart=False)
    observed, ledger = {}, []
    for p in plan.refunds:
        flow = "PENDING" if p.expected == "awaiting_approval" else "SUCCESS"
        book = to_minor(p.refunded + p.expected_amount, p.currency)
        observed[p.refund_id] = Observed(True, p.expected, flow, book)
        if p.expected_amount:
            minor = to_minor(p.expected_amount, p.currency)
            meta = {"refund_id": p.refund_id}
            ledger.append(
                {"id": f"re_{p.refund_id}", "amount": minor, "currency": p.currency.lower(), "metadata": meta}
            )
    return plan, observed, ledger


def test_judge_passes_clean_evidence_and_names_every_kind_of_violation() -> None:
    plan, observed, ledger = _clean_evidence()
    assert judge(plan, observed, ledger, audit=OK_AUDIT, faults={})["ok"]

    paid = next(p for p in plan.refunds if p.expected == "completed")
    parked = next(p for p in plan.refunds if p.expected == "awaiting_approval")
    refused = next(p for p in plan.refunds if p.expected == "rejected")
    paid_row = next(r for r in ledger if r["metadata"]["refund_id"] == paid.refund_id)
    tampered = dict(observed)
    tampered[parked.refund_id] = Observed(True, "deciding", "PENDING", 0)  # neither terminal nor parked
    tampered[refused.refund_id] = Observed(True, None, None, None)  # accepted, then nothing: lost
    verdict = judge(
        plan,
        tampered,
        [*ledger, dict(paid_row, id="re_again"), {"id": "re_x", "amount": 1, "currency": "usd", "metadata": {}}],
        audit={"ok": False, "entries": 3, "first_broken_seq": 2},
        faults={"sigkills": 1},
    )
    checks = verdict["checks"]
    assert not verdict["ok"]
    assert checks["duplicate_refunds"] == 1 and checks["unknown_ledger_refunds"] == 1
    assert checks["stuck"] == 1 and checks["lost"] == 1
    assert checks["wrong_amounts"] == 1 and checks["service_book_mismatches"] == 1
    assert any("refunded totals" in v for v in verdict["violations"])
    assert any("audit chain broken" in v for v in verdict["violations"])


def test_judge_counts_look_ups_and_names_an_investigating_refund_decided_without_one() -> None:
    plan, observed, ledger = _clean_evidence(seed=7)
    investigating = [p.refund_id for p in plan.refunds if p.carrier_says is not None]
    assert investigating
    verdict = judge(plan, observed, ledger, audit=OK_AUDIT, faults={}, look_ups=dict.fromkeys(investigating, 1))
    assert verdict["ok"], verdict["violations"]
    assert (
        verdict["investigating"]["refunds"] == verdict["investigating"]["tracking_look_up_steps"] == len(investigating)
    )
    skipped = {**dict.fromkeys(investigating, 1), investigating[0]: 0}
    verdict = judge(plan, observed, ledger, audit=OK_AUDIT, faults={}, look_ups=skipped)
    assert not verdict["ok"] and verdict["checks"]["investigations_without_a_look_up"] == 1
    assert verdict["examples"]["investigations_without_a_look_up"] == [investigating[0]]


def test_judge_expects_a_refund_the_provider_failed_to_end_failed_and_catches_one_booked_as_paid() -> None:
    plan, observed, ledger = _clean_evidence()
    paid = next(p for p in plan.refunds if p.expected == "completed")
    failed_ledger = [dict(r, status="failed") if r["metadata"]["refund_id"] == paid.refund_id else r for r in ledger]
    honest = dict(observed)
    book = to_minor(paid.refunded, paid.currency)  # nothing was paid: the book shows what was refunded before
    honest[paid.refund_id] = Observed(True, "failed", "SUCCESS", book)
    verdict = judge(plan, honest, failed_ledger, audit=OK_AUDIT, faults={})
    assert verdict["ok"], verdict["violations"]
    assert verdict["refunded"]["failed_at_provider"] == 1
    booked = judge(plan, observed, failed_ledger, audit=OK_AUDIT, faults={})  # the service says completed
    assert not booked["ok"] and booked["checks"]["booked_paid_but_failed_at_provider"] == 1
    assert booked["examples"]["booked_paid_but_failed_at_provider"] == [paid.refund_id]
    pending_ledger = [dict(r, status="pending") if r["metadata"]["refund_id"] == paid.refund_id else r for r in ledger]
    assert judge(plan, observed, pending_ledger, audit=OK_AUDIT, faults={})["checks"]["unsettled_at_provider"] == 1


def test_judge_catches_a_refund_paid_that_policy_refuses_and_an_overpaid_order() -> None:
    plan, observed, ledger = _clean_evidence(seed=6)
    refused = next(p for p in plan.refunds if p.expected == "rejected" and p.refunded < p.captured)
    minor = to_minor(refused.captured, refused.currency) + 1
    meta = {"refund_id": refused.refund_id}
    extra = {"id": "re_bad", "amount": minor, "currency": refused.currency.lower(), "metadata": meta}
    verdict = judge(plan, observed, [*ledger, extra], audit=OK_AUDIT, faults={})
    assert not verdict["ok"]
    assert verdict["checks"]["wrong_amounts"] == 1 and verdict["checks"]["over_refunded_orders"] == 1


def test_chaos_refuses_to_empty_a_directory_it_did_not_make(tmp_path: Path) -> None:
    keep = tmp_path / "precious.txt"
    keep.write_text("not a chaos run")
    with pytest.raises(ValueError, match="not a chaos work directory"):
        run_chaos(ChaosConfig(work_dir=tmp_path, refunds=1, kills=0))
    assert keep.read_text() == "not a chaos run"


@dataclass
class ChaosRun:
    config: ChaosConfig
    verdict: dict[str, Any]
    verdict_file: Path
    postmaster_started: tuple[datetime, datetime] | None
    """The private cluster's ``pg_postmaster_start_time()`` before and after the run, when it has one."""


def _postmaster_started(url: str) -> datetime:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    started: datetime = row[0]
    return started


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> ChaosRun:
    """One small soak shared by the checks below (it takes minutes): kills, payment faults, and the Postgres
    restart when a private cluster is there."""
    tmp_path = tmp_path_factory.mktemp("chaos")
    private = PRIVATE_URL if PRIVATE_CLUSTER else None
    postgres = private or (None if PG_SERVER.lower() in ("", "off") else PG_SERVER)
    config = ChaosConfig(
        refunds=40,
        kills=5,
        workers=1,
        seed=2089,  # 11 refunds investigate (in transit; returned: paid, parked, decided); after_carrier_answered armed
        postgres_url=postgres,
        fail_rate=0.15,
        drop_rate=0.15,
        latency_ms=20,
        pending_rate=0.25,
        pending_fail_share=0.4,
        pg_restart=PRIVATE_CLUSTER if private else None,
        max_seconds=300,
        settle_seconds=150,
        work_dir=tmp_path / "chaos",
        out=tmp_path / "verdict.json",
    )
    before = _postmaster_started(private) if private else None
    verdict = run_chaos(config)
    started = (before, _postmaster_started(private)) if private and before else None
    if not verdict["ok"]:
        for log in sorted((tmp_path / "chaos" / "logs").glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-4000:]}")
    return ChaosRun(config, verdict, tmp_path / "verdict.json", started)


def test_small_chaos_run_with_kills_and_payment_faults_has_no_violation(chaos_run: ChaosRun) -> None:
    verdict = chaos_run.verdict
    assert verdict["violations"] == []
    assert verdict["ok"] and json.loads(chaos_run.verdict_file.read_text())["ok"]
    assert verdict["accepted"] == 40 and sum(verdict["outcomes"].values()) == 40
    assert verdict["checks"]["duplicate_refunds"] == 0 and verdict["checks"]["lost"] == 0
    assert verdict["refunded"]["expected"] == verdict["refunded"]["ledger"]
    faults = verdict["faults"]
    assert faults.get("sigkills", 0) + faults.get("crash_point_kills", 0) >= 5
    assert faults["payment_faults_injected"] > 0
    # Refunds that settled late: some failed at the provider and ended failed, none booked as paid.
    assert faults["provider_settlement_webhooks"] > 0 and faults["provider_refunds_failed_late"] > 0
    assert verdict["refunded"]["failed_at_provider"] == faults["provider_refunds_failed_late"]
    assert verdict["checks"]["booked_paid_but_failed_at_provider"] == 0
    assert verdict["checks"]["unsettled_at_provider"] == 0
    # Refunds that investigate: each decided on exactly one recorded tracking look-up, whatever was killed.
    investigating = verdict["investigating"]
    assert investigating["refunds"] == 11 and investigating["tracking_look_up_steps"] == 11
    assert investigating["carrier_requests"] >= 11 and verdict["checks"]["investigations_without_a_look_up"] == 0


def test_small_chaos_run_survives_a_postgres_restart(chaos_run: ChaosRun) -> None:
    """Only on a private cluster (``.ci/pg-chaos-cluster`` makes one as root): reported as skipped, never
    passed, when the restart could not be arranged."""
    if chaos_run.config.pg_restart is None:
        pytest.skip(f"no Postgres restart in the chaos run: {NO_PRIVATE_CLUSTER}")
    assert chaos_run.postmaster_started is not None
    before, after = chaos_run.postmaster_started
    assert after != before, "the private cluster's postmaster was never restarted"
    assert chaos_run.verdict["faults"].get("postgres_restarts") == 1
    assert chaos_run.verdict["ok"] and chaos_run.verdict["violations"] == []
