"""The application's own book of refund requests: a request's key, its verdict and how it ended; every write also
appends to the audit log. Approvals are steps/approval_book.py; reserving and booking a payment steps/reservations.py.

``RegisteredRequest``, ``PaymentPlan`` and ``Requester`` stay in this module: checkpoints name a record's module and
class (agent/ops/checkpoints.py).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from steps import audit
from steps.notify import CustomerMessage, customer_of, queue_customer_message
from steps.records import (
    ModelUsage,
    OrderSnapshot,
    Record,
    to_minor,
)
from steps.store import (
    app_db,
    refunds,
    session,
    transaction,
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


def touch(refund_id: str, now: datetime, **values: Any) -> None:
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


def record_verdict(
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
    touch(
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
    record_verdict(refund_id, proposal, verdict, model, usage)


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
    record_verdict(refund_id, proposal, verdict, model, usage, evidence)
    record_outcome(refund_id, datetime.now(UTC), status="rejected", detail=detail, reply=reply)


def refund_requester(conn: sa.Connection | Any, refund_id: str) -> tuple[str | None, str | None] | None:
    """Who requested a refund (``requested_by``, ``requester_operator``); None when there is no such refund."""
    row = conn.execute(
        sa.select(refunds.c.requested_by, refunds.c.requester_operator).where(refunds.c.refund_id == refund_id)
    ).first()
    return None if row is None else (row.requested_by, row.requester_operator)


def record_outcome(
    refund_id: str, now: datetime, *, status: str, detail: str, reply: str | None, usage: ModelUsage | None = None
) -> None:
    values = {"model": usage.model, **_usage_values(usage)} if usage is not None else {}
    touch(refund_id, now, status=status, reserved_amount_minor=None, **values)  # whatever was held is released
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
    record_outcome(refund_id, datetime.now(UTC), status=status, detail=detail, reply=reply, usage=usage)
