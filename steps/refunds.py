"""The application's own book of refund requests; every write also appends to the audit log."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from steps import audit
from steps.claimants import claim_ahead
from steps.notify import CustomerMessage, customer_of, queue_approvers_messages, queue_customer_message
from steps.orders import ORDER_QUERY, order_from_row
from steps.records import (
    ApprovalRecord,
    ApprovalRequest,
    ModelUsage,
    OrderSnapshot,
    ProviderRefund,
    Record,
    from_minor,
    to_minor,
)
from steps.store import (
    app_db,
    approval_decisions,
    approval_requests,
    insert_if_absent,
    orders,
    read_step,
    refunds,
    session,
    transaction,
    utc,
)


class RegisteredRequest(BaseModel):
    model_config = ConfigDict(frozen=True)
    refund_id: str
    request_hash: str
    created: bool
    requested_by: str | None = None
    """Who claimed the key first (None on refunds from before requesters were recorded)."""


class PaymentPlan(Record):
    """What paying needs, read under the order's lock: checkpointed as JSON (a Record: fields added since are read
    with their defaults, from JSON and from checkpoints an older release pickled)."""

    snapshot: OrderSnapshot | None
    first_attempt_at: datetime
    refusal: str | None = None
    """Why nothing may be paid, when the plan has no snapshot for a reason other than a missing order."""
    requested: Decimal | None = None
    """What the customer asked for, from the refund's row: the re-check before paying pays no more. None: no
    amount named, or a plan recorded before this field (the bound is then what is refundable)."""


class Requester(BaseModel):
    """Who submits a refund: the principal (``client:helpdesk``, ``cli:root``) and the operator it acts for."""

    model_config = ConfigDict(frozen=True)
    principal: str
    operator: str | None = None


def register_request(
    *,
    refund_id: str,
    order_id: str,
    request_hash: str,
    currency: str,
    requested: Decimal | None,
    requester: Requester,
) -> RegisteredRequest:
    """Claim a request key before its workflow starts; a key already taken returns the first claim."""
    args = (refund_id, order_id, request_hash, currency, requested, requester)
    try:
        return _register(*args)
    except sa.exc.IntegrityError:  # a concurrent request with the same key inserted first: read its claim
        return _register(*args)


def _register(
    refund_id: str, order_id: str, request_hash: str, currency: str, requested: Decimal | None, requester: Requester
) -> RegisteredRequest:
    now = datetime.now(UTC)
    with app_db().engine.begin() as conn:
        existing = conn.execute(
            sa.select(refunds.c.request_hash, refunds.c.requested_by).where(refunds.c.refund_id == refund_id)
        ).first()
        if existing is not None:
            return RegisteredRequest(
                refund_id=refund_id,
                request_hash=existing.request_hash,
                created=False,
                requested_by=existing.requested_by,
            )
        conn.execute(
            refunds.insert().values(
                refund_id=refund_id,
                order_id=order_id,
                request_hash=request_hash,
                currency=currency,
                requested_amount_minor=None if requested is None else to_minor(requested, currency),
                status="received",
                requested_by=requester.principal,
                requester_operator=requester.operator,
                created_at=now,
                updated_at=now,
            )
        )
        payload = {
            "order_id": order_id,
            "requested": str(requested) if requested else None,
            "requested_by": requester.principal,
            "requester_operator": requester.operator,
        }
        audit.append(conn, refund_id=refund_id, event="request_received", payload=payload, now=now)
    return RegisteredRequest(
        refund_id=refund_id, request_hash=request_hash, created=True, requested_by=requester.principal
    )


def _touch(refund_id: str, now: datetime, **values: Any) -> None:
    session().execute(refunds.update().where(refunds.c.refund_id == refund_id).values(updated_at=now, **values))


def _usage_values(usage: ModelUsage | None) -> dict[str, Any]:
    if usage is None:  # recorded by a refund started before usage was kept
        return {}
    return {"model_requests": usage.requests, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}


def _claim_values(proposal: dict[str, Any], evidence: dict[str, Any] | None) -> dict[str, Any]:
    """The claim's category and evidence on the row (refunds decided before evidence record neither)."""
    if evidence is None:
        return {}
    return {"claim_category": str(proposal.get("category") or "other"), "evidence": evidence}


def _evidence_entry(proposal: dict[str, Any], verdict: dict[str, Any], evidence: dict[str, Any]) -> dict[str, Any]:
    """The audit's record of the evidence: what was looked up, what failed, what policy found, and the SHA-256 of
    the evidence as the row keeps it, so a changed row no longer matches its entry in the chain."""
    canonical = json.dumps(evidence, sort_keys=True, separators=(",", ":"), default=str)
    return {
        "category": proposal.get("category") or "other",
        "looked_up": [name for name in ("tracking", "returns", "risk", "tickets") if evidence.get(name) is not None],
        "failed": evidence.get("failed") or {},
        "findings": list(verdict.get("findings") or []),
        "flags": list(verdict.get("flags") or []),
        "evidence_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }


def _record_verdict(
    refund_id: str,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None,
    evidence: dict[str, Any] | None = None,
) -> None:
    now = datetime.now(UTC)
    currency = str(proposal["currency"])
    amount = Decimal(str(verdict["amount"]))  # the proposal, or the requested amount that bounded it
    _touch(
        refund_id,
        now,
        proposed_amount_minor=to_minor(amount, currency) if currency == verdict["currency"] else None,
        verdict=verdict["kind"],
        reason=str(proposal["reason"]),
        customer_reply=str(proposal["customer_reply"]),
        model=model,
        status="deciding",
        **_usage_values(usage),
        **_claim_values(proposal, evidence),
    )
    payload = {**proposal, "model": model, **({"usage": usage.model_dump()} if usage else {})}
    audit.append(session(), refund_id=refund_id, event="agent_proposed", payload=payload, now=now)
    if evidence is not None:
        entry = _evidence_entry(proposal, verdict, evidence)
        audit.append(session(), refund_id=refund_id, event="claim_evidence", payload=entry, now=now)
    audit.append(session(), refund_id=refund_id, event="policy_verdict", payload=verdict, now=now)


@transaction("refunds.record_verdict")
def record_verdict_step(
    refund_id: str, *, proposal: dict[str, Any], verdict: dict[str, Any], model: str, usage: ModelUsage | None = None
) -> None:
    """A refused verdict, recorded alone (refunds started before ``record_refusal``)."""
    _record_verdict(refund_id, proposal, verdict, model, usage)


@transaction("refunds.record_refusal")
def record_refusal_step(
    refund_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None,
    detail: str,
    reply: str | None,
    evidence: dict[str, Any] | None = None,
) -> None:
    """A refused refund ends here: the verdict, the outcome and the customer's message commit together."""
    _record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    _record_outcome(refund_id, datetime.now(UTC), status="rejected", detail=detail, reply=reply)


@transaction("refunds.open_approval")
def open_approval_step(
    refund_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None = None,
    amount: Decimal,
    currency: str,
    reason: str,
    escalate_after: float,
    timeout: float,
    evidence: dict[str, Any] | None = None,
) -> ApprovalRequest:
    """Record the verdict and the approval request it needs, together; the refund is parked from here on.

    A fork that runs this step again keeps the first request (and its deadlines)."""
    now = datetime.now(UTC)
    _record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    values = {
        "refund_id": refund_id,
        "amount_minor": to_minor(amount, currency),
        "currency": currency,
        "reason": reason,
        "requested_at": now,
        "escalate_at": now + timedelta(seconds=escalate_after),
        "expires_at": now + timedelta(seconds=timeout),
    }
    insert_if_absent(session(), approval_requests, values)
    request = approval_request(session(), refund_id)
    assert request is not None
    _touch(refund_id, now, status="awaiting_approval")
    window = {
        "requested_at": request.requested_at.isoformat(),
        "escalate_at": request.escalate_at.isoformat(),
        "expires_at": request.expires_at.isoformat(),
    }
    audit.append(session(), refund_id=refund_id, event="approval_requested", payload=window, now=now)
    return request


def refund_requester(conn: sa.Connection | Any, refund_id: str) -> tuple[str | None, str | None] | None:
    """Who requested a refund (``requested_by``, ``requester_operator``); None when there is no such refund."""
    row = conn.execute(
        sa.select(refunds.c.requested_by, refunds.c.requester_operator).where(refunds.c.refund_id == refund_id)
    ).first()
    return None if row is None else (row.requested_by, row.requester_operator)


def approval_request(conn: sa.Connection | Any, refund_id: str) -> ApprovalRequest | None:
    """The approval a refund waits on (or waited on), with who requested the refund."""
    row = conn.execute(
        sa.select(approval_requests, refunds.c.requested_by, refunds.c.requester_operator)
        .outerjoin(refunds, refunds.c.refund_id == approval_requests.c.refund_id)
        .where(approval_requests.c.refund_id == refund_id)
    ).first()
    if row is None:
        return None
    return ApprovalRequest(
        refund_id=row.refund_id,
        amount=from_minor(row.amount_minor, row.currency),
        currency=row.currency,
        reason=row.reason,
        requested_at=utc(row.requested_at),
        escalate_at=utc(row.escalate_at),
        expires_at=utc(row.expires_at),
        escalated_at=utc(row.escalated_at) if row.escalated_at else None,
        requested_by=row.requested_by,
        requester_operator=row.requester_operator,
    )


def _approval_from_row(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        refund_id=row.refund_id,
        decision=row.decision,
        approver=row.approver,
        amount=from_minor(row.amount_minor, row.currency),
        currency=row.currency,
        decided_at=utc(row.decided_at),
        note=row.note,
        via=row.via,
    )


def recorded_decision(conn: sa.Connection | Any, refund_id: str) -> ApprovalRecord | None:
    row = conn.execute(sa.select(approval_decisions).where(approval_decisions.c.refund_id == refund_id)).first()
    return _approval_from_row(row) if row else None


def _claim_decision(conn: Any, record: ApprovalRecord) -> tuple[ApprovalRecord, bool]:
    """Insert the decision unless one exists; return the recorded one and whether it is ours."""
    values = {
        "refund_id": record.refund_id,
        "decision": record.decision,
        "approver": record.approver,
        "amount_minor": to_minor(record.amount, record.currency),
        "currency": record.currency,
        "decided_at": record.decided_at,
        "note": record.note,
        "via": record.via,
    }
    if not insert_if_absent(conn, approval_decisions, values):
        existing = recorded_decision(conn, record.refund_id)
        assert existing is not None
        return existing, False
    asked = conn.execute(
        sa.select(approval_requests.c.amount_minor, approval_requests.c.currency).where(
            approval_requests.c.refund_id == record.refund_id
        )
    ).first()
    payload = record.model_dump()
    if asked is not None:  # an approver may approve less than asked: the entry names both
        payload["asked_amount"] = from_minor(asked.amount_minor, asked.currency)
    audit.append(conn, refund_id=record.refund_id, event="approval_decided", payload=payload, now=record.decided_at)
    return record, True


@transaction("refunds.record_decision")
def record_decision_step(record: ApprovalRecord) -> ApprovalRecord:
    """A person's decision, first writer wins: concurrent writers serialize on the key and all see one."""
    standing, _ = _claim_decision(session(), record)
    return standing


@read_step("refunds.standing_decision")
def standing_decision_step(conn: sa.Connection, refund_id: str) -> ApprovalRecord | None:
    """The recorded decision, for a continuation whose decision message did not come."""
    return recorded_decision(conn, refund_id)


@transaction("refunds.expire_approval")
def expire_approval_step(
    refund_id: str, *, amount: Decimal, currency: str, detail: str, reply: str | None
) -> ApprovalRecord:
    """At the deadline: the decision that stands. With none, the expiry is recorded and the refund ends
    rejected, its customer told, in this one transaction; a person's decision that won the race stands."""
    now = datetime.now(UTC)
    expired = ApprovalRecord(
        refund_id=refund_id,
        decision="expired",
        approver="system",
        amount=amount,
        currency=currency,
        decided_at=now,
        note="no decision before the approval deadline",
        via="deadline",
    )
    standing, ours = _claim_decision(session(), expired)
    if ours:
        _record_outcome(refund_id, now, status="rejected", detail=detail, reply=reply)
    return standing


@transaction("refunds.escalate_approval")
def escalate_approval_step(refund_id: str, *, messages: dict[str, str]) -> bool:
    """Remind approvers once (operator name -> text with their link), unless the refund was decided meanwhile;
    True when the reminder was queued."""
    if recorded_decision(session(), refund_id) is not None:
        return False
    now = datetime.now(UTC)
    session().execute(
        approval_requests.update().where(approval_requests.c.refund_id == refund_id).values(escalated_at=now)
    )
    queue_approvers_messages(refund_id, kind="escalation", messages=messages)
    audit.append(session(), refund_id=refund_id, event="approval_escalated", payload={}, now=now)
    return True


@transaction("refunds.prepare_approved_payment")
def prepare_approved_payment_step(refund_id: str, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve an approved refund's amount against its order right before paying; stamp the first attempt
    (kept across retries). The order comes from the refund's row; the amount is the one approved, which is
    more than 0 and at most what its approval request asked for, in the request's currency (an approver may
    approve less, never more).

    The snapshot counts what other refunds of the order are paying right now as already refunded, so
    two refunds of one order on two workers cannot both pass the balance check. The order's row is
    locked on Postgres; SQLite's IMMEDIATE transactions serialize writers anyway.
    """
    found = (
        session()
        .execute(
            sa.select(refunds.c.order_id, approval_requests.c.amount_minor, approval_requests.c.currency)
            .join(approval_requests, approval_requests.c.refund_id == refunds.c.refund_id)
            .where(refunds.c.refund_id == refund_id)
        )
        .first()
    )
    if found is None:
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal="no approval request")
    if currency != found.currency or not 0 < amount <= from_minor(found.amount_minor, found.currency):
        asked = f"{from_minor(found.amount_minor, found.currency)} {found.currency}"
        refusal = f"the approval is for {amount} {currency} but the request was for at most {asked}"
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal=refusal)
    order_id = str(found.order_id)
    return _reserve(refund_id, order_id, _locked_order(order_id), amount=amount, currency=currency)


@transaction("refunds.record_verdict_and_reserve")
def record_verdict_and_reserve_step(
    refund_id: str,
    order_id: str,
    *,
    proposal: dict[str, Any],
    verdict: dict[str, Any],
    model: str,
    usage: ModelUsage | None = None,
    amount: Decimal,
    currency: str,
    evidence: dict[str, Any] | None = None,
    open_claims_allowed: int = 1,
) -> PaymentPlan:
    """An auto-approved refund has nothing to wait for: its verdict and its reservation commit together.

    The order's row is locked first, before the verdict's audit entries take the audit chain's lock:
    ``record_payment`` takes the two in that order, and the reverse order deadlocks against it.
    """
    order = _locked_order(order_id)
    _record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    # One open claim per order: the case file sent a second claim to a person, but two claims decided at once can
    # each have been read before the other; under the order's lock, the later one is refused, nothing reserved.
    if (ahead := claim_ahead(session(), refund_id, order_id, allowed=open_claims_allowed)) is not None:
        refusal = f"{ahead}: a second claim on one order is never paid on its own"
        return PaymentPlan(snapshot=None, first_attempt_at=datetime.now(UTC), refusal=refusal)
    return _reserve(refund_id, order_id, order, amount=amount, currency=currency)


def _locked_order(order_id: str) -> Any:
    """The order's row, locked until the transaction ends (Postgres; SQLite serializes writers anyway)."""
    return session().execute(ORDER_QUERY.where(orders.c.order_id == order_id).with_for_update(of=orders)).first()


def _reserve(refund_id: str, order_id: str, row: Any, *, amount: Decimal, currency: str) -> PaymentPlan:
    """Reserve ``amount`` on the refund's row against ``row``, the order as read under its lock; the plan carries
    the amount the refund's request asked for, read in the same transaction, for the re-check before paying."""
    now = datetime.now(UTC)
    mine = (
        session()
        .execute(
            sa.select(refunds.c.payment_started_at, refunds.c.requested_amount_minor, refunds.c.currency).where(
                refunds.c.refund_id == refund_id
            )
        )
        .one()
    )
    first = utc(mine.payment_started_at) if mine.payment_started_at else now
    asked = mine.requested_amount_minor
    requested = None if asked is None else from_minor(asked, mine.currency)
    in_flight = (
        session()
        .execute(
            sa.select(sa.func.coalesce(sa.func.sum(refunds.c.reserved_amount_minor), 0)).where(
                refunds.c.order_id == order_id,
                refunds.c.refund_id != refund_id,
                refunds.c.reserved_amount_minor.is_not(None),
            )
        )
        .scalar_one()
    )
    _touch(refund_id, now, status="paying", payment_started_at=first, reserved_amount_minor=to_minor(amount, currency))
    snapshot = None
    if row is not None:
        order = order_from_row(row)
        held = from_minor(int(in_flight), order.currency)
        snapshot = OrderSnapshot(
            order=order.model_copy(update={"amount_refunded": order.amount_refunded + held}), as_of=now
        )
    return PaymentPlan(snapshot=snapshot, first_attempt_at=first, requested=requested)


@transaction("refunds.record_payment")
def record_payment_step(
    refund_id: str, order_id: str, payment: ProviderRefund, *, notify: CustomerMessage | None = None
) -> None:
    """Book the provider's refund against the order (once per provider refund id); queue ``notify`` with it."""
    now = datetime.now(UTC)
    minor = to_minor(payment.amount, payment.currency)
    recorded = (
        session()
        .execute(sa.select(refunds.c.provider_refund_id).where(refunds.c.refund_id == refund_id))
        .scalar_one_or_none()
    )
    if recorded != payment.provider_refund_id:  # a fork re-running this step gets the same provider refund back
        session().execute(
            orders.update()
            .where(orders.c.order_id == order_id)
            .values(amount_refunded_minor=orders.c.amount_refunded_minor + minor)
        )
    _touch(
        refund_id,
        now,
        status="completed",
        reserved_amount_minor=None,
        provider_refund_id=payment.provider_refund_id,
        idempotency_key=payment.idempotency_key,
    )
    audit.append(session(), refund_id=refund_id, event="refund_paid", payload=payment.model_dump(), now=now)
    if notify is not None:
        queue_customer_message(refund_id, notify)


def _record_outcome(
    refund_id: str, now: datetime, *, status: str, detail: str, reply: str | None, usage: ModelUsage | None = None
) -> None:
    values = {"model": usage.model, **_usage_values(usage)} if usage is not None else {}
    _touch(refund_id, now, status=status, reserved_amount_minor=None, **values)  # whatever was held is released
    audit.append(session(), refund_id=refund_id, event=f"refund_{status}", payload={"detail": detail}, now=now)
    if reply is not None:
        queue_customer_message(refund_id, CustomerMessage(customer_id=customer_of(refund_id), text=reply))


@transaction("refunds.record_outcome")
def record_outcome_step(
    refund_id: str,
    *,
    status: Literal["rejected", "failed", "cancelled"],
    detail: str,
    reply: str | None = None,
    usage: ModelUsage | None = None,
) -> None:
    """Record how the refund ended without paying; queue ``reply`` to its customer with it."""
    _record_outcome(refund_id, datetime.now(UTC), status=status, detail=detail, reply=reply, usage=usage)
