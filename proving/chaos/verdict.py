"""Judging a chaos run: the plan's expectations against the provider's ledger and the service's books.

``judge`` is pure (data in, verdict out) so the checks themselves are tested on made-up evidence too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from proving.chaos.plan import Plan
from steps.records import from_minor, quantize, to_minor

VERDICT_VERSION = 3
TERMINAL = ("completed", "rejected", "failed", "cancelled")
#: Ledger refunds that sent nothing: the provider failed or canceled them (possibly after days pending).
UNPAID = ("failed", "canceled")


@dataclass(frozen=True)
class Observed:
    """What the service says about one refund at the end of the run."""

    accepted: bool
    status: str | None
    """The refund's status in the application database (None: no row, i.e. lost)."""
    workflow: str | None
    """The DBOS workflow status (None: no workflow, i.e. lost)."""
    order_refunded_minor: int | None
    """What the service's book says was refunded on the order (including refunds before the run)."""


_UNSEEN = Observed(False, None, None, None)


def _totals(amounts: list[tuple[str, Decimal]]) -> dict[str, str]:
    sums: dict[str, Decimal] = defaultdict(Decimal)
    for currency, amount in amounts:
        sums[currency] += amount
    return {c: str(quantize(sums[c], c)) for c in sorted(sums)}


def judge(
    plan: Plan,
    observed: dict[str, Observed],
    ledger: list[dict[str, Any]],
    *,
    audit: dict[str, Any],
    faults: dict[str, int],
    extra_violations: list[str] | None = None,
    look_ups: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The verdict document: counts, totals, and every violated invariant by name.

    ``look_ups``: recorded tracking look-up steps per investigating refund; an accepted one with none was decided
    without the evidence its claim needs (policy would send it to a person, so its outcome is off too).
    """
    planned = {p.refund_id: p for p in plan.refunds}
    by_refund: dict[str, list[dict[str, Any]]] = defaultdict(list)
    unknown = 0
    for row in ledger:
        refund_id = (row.get("metadata") or {}).get("refund_id")
        if refund_id in planned:
            by_refund[refund_id].append(row)
        else:
            unknown += 1
    violations: list[str] = list(extra_violations or [])
    duplicates = sum(len(rows) - 1 for rows in by_refund.values() if len(rows) > 1)
    lost, stuck, mismatched, wrong_amount, over_refunded, book_mismatch = [], [], [], [], [], []
    booked_but_failed, unsettled, failed_late = [], [], []
    outcomes: Counter[str] = Counter()
    expected_paid: list[tuple[str, Decimal]] = []
    for p in plan.refunds:
        seen = observed.get(p.refund_id)
        rows = by_refund.get(p.refund_id, [])
        paid_rows = [r for r in rows if r.get("status", "succeeded") not in UNPAID]
        unsettled += [p.refund_id for r in rows if r.get("status") in ("pending", "requires_action")]
        paid = sum((from_minor(int(r["amount"]), p.currency) for r in paid_rows), Decimal(0))
        # A refund the provider took and then failed ends failed with nothing paid; the plan cannot know which.
        failed_at_provider = bool(rows) and not paid_rows
        ends, expected_amount = ("failed", Decimal(0)) if failed_at_provider else (p.expected, p.expected_amount)
        expected_paid.append((p.currency, expected_amount))
        if seen is None or not seen.accepted:
            outcomes["not_submitted"] += 1
            continue
        if seen.status is None or seen.workflow is None:
            lost.append(p.refund_id)
            outcomes["lost"] += 1
            continue
        outcomes[seen.status] += 1
        if failed_at_provider:
            failed_late.append(p.refund_id)
            if seen.status == "completed":
                booked_but_failed.append(p.refund_id)
        if seen.status not in TERMINAL and not (p.expected == "awaiting_approval" and seen.status == p.expected):
            stuck.append(p.refund_id)
        elif seen.status != ends:
            mismatched.append(f"{p.refund_id}: expected {ends}, ended {seen.status}")
        if paid != expected_amount:
            wrong_amount.append(f"{p.refund_id}: expected {expected_amount} {p.currency} paid, ledger has {paid}")
        if p.refunded + paid > p.captured:
            over_refunded.append(p.order_id)
        if seen.order_refunded_minor is not None and seen.order_refunded_minor != to_minor(
            p.refunded + paid, p.currency
        ):
            book_mismatch.append(f"{p.order_id}: service book {seen.order_refunded_minor}, ledger {p.refunded + paid}")
    investigating = [p for p in plan.refunds if p.carrier_says is not None]
    unchecked = [
        p.refund_id
        for p in investigating
        if look_ups is not None and (observed.get(p.refund_id) or _UNSEEN).accepted and not look_ups.get(p.refund_id)
    ]
    expected_totals = _totals(expected_paid)
    ledger_totals = _totals(
        [
            (str(r["currency"]).upper(), from_minor(int(r["amount"]), str(r["currency"]).upper()))
            for r in ledger
            if r.get("status", "succeeded") not in UNPAID
        ]
    )
    checks = {
        "not_submitted": outcomes.get("not_submitted", 0),
        "duplicate_refunds": duplicates,
        "unknown_ledger_refunds": unknown,
        "lost": len(lost),
        "stuck": len(stuck),
        "unexpected_outcomes": len(mismatched),
        "wrong_amounts": len(wrong_amount),
        "over_refunded_orders": len(over_refunded),
        "service_book_mismatches": len(book_mismatch),
        "booked_paid_but_failed_at_provider": len(booked_but_failed),
        "unsettled_at_provider": len(unsettled),
        "investigations_without_a_look_up": len(unchecked),
    }
    violations += [f"{name}: {count}" for name, count in checks.items() if count]
    if expected_totals != ledger_totals:
        violations.append(f"refunded totals: expected {expected_totals}, ledger {ledger_totals}")
    if not audit.get("ok"):
        violations.append(f"audit chain broken: {audit}")
    expected = Counter(p.expected for p in plan.refunds)
    return {
        "version": VERDICT_VERSION,
        "ok": not violations,
        "seed": plan.seed,
        "plan_fingerprint": plan.fingerprint(),
        "requested": len(plan.refunds),
        "accepted": sum(1 for o in observed.values() if o.accepted),
        "expected": {k: expected.get(k, 0) for k in ("completed", "rejected", "awaiting_approval")},
        "outcomes": dict(sorted(outcomes.items())),
        "refunded": {
            "expected": expected_totals,
            "ledger": ledger_totals,
            "ledger_refunds": len(ledger),
            "failed_at_provider": len(failed_late),
        },
        "investigating": {
            "refunds": len(investigating),
            "carrier_says": dict(sorted(Counter(str(p.carrier_says) for p in investigating).items())),
            "tracking_look_up_steps": sum((look_ups or {}).values()),
        },
        "checks": checks,
        "audit_chain": audit,
        "faults": dict(sorted(faults.items())),
        "violations": violations,
        "examples": {
            "lost": lost[:5],
            "stuck": stuck[:5],
            "unexpected_outcomes": mismatched[:5],
            "wrong_amounts": wrong_amount[:5],
            "over_refunded_orders": over_refunded[:5],
            "service_book_mismatches": book_mismatch[:5],
            "booked_paid_but_failed_at_provider": booked_but_failed[:5],
            "unsettled_at_provider": unsettled[:5],
            "investigations_without_a_look_up": unchecked[:5],
        },
    }


def render(verdict: dict[str, Any]) -> str:
    """The human-readable verdict."""
    lines = [
        f"chaos verdict: {'PASS' if verdict['ok'] else 'FAIL'}  (seed {verdict['seed']}, "
        f"plan {verdict['plan_fingerprint']}, {verdict.get('backend', '?')}, {verdict.get('duration_s', '?')} s)",
        f"  requested {verdict['requested']}, accepted {verdict['accepted']}; expected {verdict['expected']}",
        f"  outcomes  {verdict['outcomes']}",
        f"  refunded  expected {verdict['refunded']['expected']}",
        f"            ledger   {verdict['refunded']['ledger']} ({verdict['refunded']['ledger_refunds']} refunds)",
    ]
    inv = verdict.get("investigating") or {}
    if inv.get("refunds"):
        lines.append(
            f"  investigating {inv['refunds']} {inv['carrier_says']}: {inv['tracking_look_up_steps']} tracking look-up "
            f"steps recorded, {inv.get('carrier_requests', '?')} carrier requests"
        )
    lines += [f"  {'PASS' if n == 0 else 'FAIL'}  {name}: {n}" for name, n in verdict["checks"].items()]
    audit = verdict["audit_chain"]
    lines.append(f"  {'PASS' if audit.get('ok') else 'FAIL'}  audit chain: {audit.get('entries')} entries")
    lines.append("  faults    " + ", ".join(f"{k}={v}" for k, v in verdict["faults"].items()))
    lines += [f"  VIOLATION {v}" for v in verdict["violations"]]
    return "\n".join(lines)
