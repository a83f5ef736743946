"""A refund's state in lines a person reads at a terminal: `refund-agent status` (a summary: phase, outcome,
amounts, and the timeline of what happened, from the audit log) and `refund-agent steps` (its DBOS steps across
its workflows, in the order they ran).

Both read what ``agent.status`` assembles for the API; ``refund-agent status --json`` prints that whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from steps.records import AuditEntry, format_money

#: The phases in which a refund has ended (``agent.status.FINAL``): what it paid by then is all it pays.
FINAL = ("completed", "rejected", "failed", "cancelled")

#: At most this many characters of a free-text detail (a reason, a refusal) on one line.
DETAIL_CHARS = 100


def _clip(text: object) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= DETAIL_CHARS else flat[: DETAIL_CHARS - 3] + "..."


def _money(amount: object, currency: object) -> str:
    if amount in (None, "") or not currency:
        return "-"
    return format_money(Decimal(str(amount)), str(currency))


def _moment(rfc3339_or_iso: object) -> datetime:
    return datetime.fromisoformat(str(rfc3339_or_iso).replace("Z", "+00:00"))


def _when(rfc3339_or_iso: object) -> str:
    """An API time (``...Z``) or an ISO one as ``2026-12-03 09:30 UTC``."""
    return f"{_moment(rfc3339_or_iso):%Y-%m-%d %H:%M} UTC"


def event_text(entry: AuditEntry, currency: str | None) -> str:
    """One audit entry of the refund in words."""
    p = entry.payload
    match entry.event:
        case "request_received":
            asked = _money(p.get("requested"), currency) if p.get("requested") else "the order's refundable balance"
            return f"requested by {p.get('requested_by')}, for {asked}"
        case "agent_proposed":
            about = "; ".join(str(p[k]) for k in ("category", "model") if p.get(k))
            return f"the agent proposed {_money(p.get('amount'), p.get('currency'))}" + (f" ({about})" if about else "")
        case "claim_evidence":
            return "looked up: " + (", ".join(p.get("looked_up") or []) or "nothing")
        case "policy_verdict":
            reasons = "; ".join(p.get("reasons") or [])
            return _clip(f"policy: {str(p.get('kind')).replace('_', ' ')}" + (f" ({reasons})" if reasons else ""))
        case "approval_requested":
            return f"waiting for a person's decision until {_when(p['expires_at'])}"
        case "approval_escalated":
            return "approvers reminded"
        case "approval_decided" if p.get("decision") == "expired":
            return "nobody decided before the deadline: the approval expired"
        case "approval_decided":
            money = f" for {_money(p.get('amount'), p.get('currency'))}" if p.get("decision") == "approve" else ""
            return f"{p.get('decision')}d by {p.get('approver')} via {p.get('via')}{money}"
        case "refund_pending":
            return f"sent to the provider ({p.get('provider_refund_id')}); it is pending"
        case "refund_paid":
            money = _money(p.get("amount"), p.get("currency"))
            return f"paid {money}: provider refund {p.get('provider_refund_id')}"
        case _ if "detail" in p:
            return _clip(f"{entry.event.replace('_', ' ')}: {p['detail']}")
        case _:
            actor = next((p[k] for k in ("by", "operator", "approver") if p.get(k)), None)
            return entry.event.replace("_", " ") + (f" by {actor}" if actor else "")


def _outcome(status: Mapping[str, Any]) -> str:
    outcome = status.get("outcome")
    if outcome is None:
        return "not ended yet"
    if outcome.get("status") == "completed":
        paid = _money(outcome.get("amount"), outcome.get("currency"))
        return f"completed: paid {paid} (provider refund {outcome.get('provider_refund_id')})"
    return _clip(f"{outcome.get('status')}: {outcome.get('detail') or ''}".rstrip(": "))


def summary_lines(status: Mapping[str, Any], events: list[AuditEntry]) -> list[str]:
    """``refund-agent status``: the refund's phase, outcome, amounts and the timeline of its events."""
    refund_id, currency = status["refund_id"], status.get("currency")
    by_event = {e.event: e.payload for e in events}  # the last entry of each kind
    received = by_event.get("request_received")
    approval = status.get("approval") or {}
    rows = [("phase", str(status["status"])), ("outcome", _outcome(status))]
    if received is not None or status.get("amount_requested"):  # the refund's own fields: the API's named amounts
        asked = status.get("amount_requested")
        rows.append(("asked", _money(asked, currency) if asked else "the order's refundable balance"))
    if "agent_proposed" in by_event:
        rows.append(("proposed", _money(by_event["agent_proposed"].get("amount"), currency)))
    if approval.get("approved_amount"):
        rows.append(("approved", f"{_money(approval['approved_amount'], currency)} by {approval.get('approver')}"))
    paid = status.get("amount_refunded")
    rows.append(("paid", _money(paid, currency) if paid else "none" if status["status"] in FINAL else "nothing yet"))
    request = approval.get("request")
    if status["status"] == "awaiting_approval" and request:
        rows.append(("waiting", f"for a person's decision until {_when(request['expires_at'])}"))
    about = [f"order {status['order_id']}"] if status.get("order_id") else []
    about += [f"requested by {status['requested_by']}"] if status.get("requested_by") else []
    lines = [f"Refund {refund_id}" + (f" ({', '.join(about)})" if about else ""), *(f"  {k:<9} {v}" for k, v in rows)]
    lines.append("Timeline (UTC):" if events else "Timeline: nothing recorded yet")
    lines += [f"  {e.created_at:%Y-%m-%d %H:%M:%S}  {event_text(e, currency)}" for e in events]
    lines.append("(--json: the whole record; `refund-agent steps` lists its DBOS steps)")
    return lines


def timer_note(step: Mapping[str, Any], approval: Mapping[str, Any] | None) -> str:
    """What a timer's step did, where its name alone would mislead: the deadline's ``refunds.expire_approval``
    and the reminder's ``refunds.escalate_approval`` run on every parked refund, and once it is decided they
    only find the decision and end."""
    decision = (approval or {}).get("decision")
    if step["name"] == "refunds.expire_approval" and decision is not None:
        return "expired: nobody decided in time" if decision == "expired" else f"found it {decision}d: nothing expired"
    if step["name"] == "refunds.escalate_approval" and decision not in (None, "expired"):
        decided_at, started = (approval or {}).get("decided_at"), step.get("start")
        if decided_at and started and _moment(started) >= _moment(decided_at):
            return f"found it {decision}d: no reminder"
    return ""


def timeline_lines(refund_id: str, steps: list[dict[str, Any]], approval: Mapping[str, Any] | None = None) -> list[str]:
    """A refund's step timeline (``agent.status.step_timeline``) as lines a person reads, one step each, in the
    order they started (the workflows interleave: a decision runs while the deadline timer waits). ``approval``:
    the refund's approval (``refund_status``), to say what its timers found."""
    lines = [f"  {'workflow':<10} {'#':>3}  {'step':<34} {'started (UTC)':<12}  {'took':>9}  note"]
    never = datetime.max.replace(tzinfo=UTC)  # a step without a start time (none in dbos 3.4) goes last
    ordered = sorted(steps, key=lambda s: (_moment(s["start"]) if s["start"] else never, s["workflow"], s["step"]))
    for step in ordered:
        took = f"{step['duration_ms']:>6} ms" if step["duration_ms"] is not None else "      -"
        run = step["workflow"].removeprefix(refund_id) or "(refund)"
        start = f"{_moment(step['start']):%H:%M:%S.%f}"[:12] if step["start"] else ""
        note = f"error: {_clip(step['error'])}" if step["error"] else timer_note(step, approval)
        lines.append(f"  {run:<10} {step['step']:>3}  {step['name']:<34} {start:<12}  {took:>9}  {note}".rstrip())
    return lines
