"""The evidence look-ups, one DBOS step per service: the carrier's tracking (EasyPost-shaped), the warehouse's returns
(RMA, ShipBob-shaped), the payment's risk signals (Stripe's early fraud warnings and disputes on the charge) and the
customer's earlier tickets (Zendesk-shaped).

The agent's tools call these steps only when a claim needs them; what they return are the records of
steps/evidence.py; steps/evidence_http.py says how they call and retry. The step names are durable (recorded with
every workflow that ran them): never rename them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, cast, get_args

import stripe
from dbos import DBOS

from steps.evidence import (
    AuthorRole,
    DeliveryProof,
    Dispute,
    DisputeStatus,
    FraudWarning,
    LineCondition,
    ReturnLine,
    ReturnReceipt,
    ReturnStatus,
    RiskSignals,
    Ticket,
    TicketComment,
    TicketHistory,
    Tracking,
    TrackingEvent,
    TrackingStatus,
)
from steps.evidence_http import EvidenceUnavailable, Transient, call_json, clip, config, retrying
from steps.faults import crash_point
from steps.payments import stripe_client
from steps.records import from_minor

TRACK_SHIPMENT_STEP = "evidence.track_shipment"
RETURN_STATUS_STEP = "evidence.return_status"
PAYMENT_RISK_STEP = "evidence.payment_risk"
TICKET_HISTORY_STEP = "evidence.ticket_history"

#: What the model reads is kept small: tickets, comments per ticket, and characters per text.
MAX_TICKETS = 5
MAX_COMMENTS = 5
MAX_COMMENT_CHARS = 500
MAX_TEXT_CHARS = 200
_TRACKING_STATUSES: frozenset[str] = frozenset(get_args(TrackingStatus))
_CONDITIONS: frozenset[str] = frozenset(get_args(LineCondition))
_DISPUTE_STATUSES: frozenset[str] = frozenset(get_args(DisputeStatus))
_ROLES: frozenset[str] = frozenset(get_args(AuthorRole))
#: ShipBob's return order status -> ours.
_RETURN_STATUSES: dict[str, ReturnStatus] = {
    "AwaitingArrival": "label_created",
    "InTransit": "in_transit",
    "Arrived": "received",
    "Processing": "received",
    "ActionRequired": "received",
    "Completed": "inspected",
    "Cancelled": "none",
}


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _tracking_status(value: Any) -> TrackingStatus:
    return cast(TrackingStatus, value) if value in _TRACKING_STATUSES else "unknown"


@DBOS.step(name=TRACK_SHIPMENT_STEP)
def track_shipment_step(carrier: str, tracking_code: str) -> Tracking:
    """What the carrier says about the shipment: an EasyPost tracker, created (or found) for the code.

    EasyPost answers a code the carrier does not know with a tracker whose status is ``unknown``: that is
    ``found=False``, not an error. A photo proof of delivery is read from ``carrier_detail.proof_of_delivery``
    (docs/operations/evidence-services.md)."""
    cfg = config()
    body = {"tracker": {"tracking_code": tracking_code, "carrier": carrier}}
    answer = call_json(
        "carrier",
        "POST",
        f"{cfg.carrier_base_url}/v2/trackers",
        auth=(cfg.carrier_api_key, ""),
        body=body,
        not_found=True,
    )
    crash_point("after_carrier_answered")
    if not isinstance(answer, dict):
        return Tracking(carrier=carrier, tracking_code=tracking_code, found=False)
    return _tracking(carrier, tracking_code, answer)


def _tracking(carrier: str, tracking_code: str, tracker: dict[str, Any]) -> Tracking:
    status = _tracking_status(tracker.get("status"))
    events = []
    for detail in tracker.get("tracking_details") or []:
        at = _time(detail.get("datetime"))
        if at is None:
            continue
        where = detail.get("tracking_location") or {}
        place = ", ".join(str(where[k]) for k in ("city", "state", "country") if where.get(k))
        message = clip(str(detail.get("message") or ""), MAX_TEXT_CHARS)
        events.append(TrackingEvent(status=_tracking_status(detail.get("status")), message=message, at=at, place=place))
    events.sort(key=lambda e: e.at)
    signed_by = clip(str(tracker.get("signed_by") or ""), MAX_TEXT_CHARS)
    pod = (tracker.get("carrier_detail") or {}).get("proof_of_delivery")
    proof: DeliveryProof = "signature" if signed_by or pod == "signature" else ("photo" if pod == "photo" else "none")
    delivered = [e.at for e in events if e.status == "delivered"]
    return Tracking(
        carrier=carrier,
        tracking_code=tracking_code,
        found=status != "unknown",
        status=status,
        est_delivery=_time(tracker.get("est_delivery_date")),
        delivered_at=delivered[-1] if status == "delivered" and delivered else None,
        proof=proof if status == "delivered" else "none",
        signed_by=signed_by,
        events=events,
    )


@DBOS.step(name=RETURN_STATUS_STEP)
def return_status_step(order_id: str) -> ReturnReceipt:
    """The warehouse's return for the order (a ShipBob return order whose ``reference_id`` is the order id);
    ``status="none"`` when none was opened (or it was cancelled). Line amounts are the ``amount_paid`` each
    inventory line carries; a line without one counts 0, so a receipt never claims more than it shows."""
    cfg = config()
    answer = call_json(
        "returns",
        "GET",
        f"{cfg.returns_base_url}/2026-01/return",
        headers={"Authorization": f"Bearer {cfg.returns_api_key}"},
        params={"ReferenceIds": order_id},
    )
    crash_point("after_warehouse_answered")
    items = answer.get("items", []) if isinstance(answer, dict) else answer
    mine = [r for r in items or [] if isinstance(r, dict) and r.get("reference_id") == order_id]
    live = [r for r in mine if r.get("status") != "Cancelled"]
    if not live:
        return ReturnReceipt(order_id=order_id)
    latest = max(live, key=lambda r: str(r.get("insert_date") or ""))
    return _receipt(order_id, latest)


def _amount(value: Any) -> Decimal:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return Decimal(0)
    return amount if amount.is_finite() and amount >= 0 else Decimal(0)


def _receipt(order_id: str, ret: dict[str, Any]) -> ReturnReceipt:
    history = {str(h.get("status")): _time(h.get("timestamp")) for h in ret.get("status_history") or []}
    lines = []
    for item in ret.get("inventory") or []:
        taken = item.get("action_taken") or []
        processed = sum(int(t.get("quantity_processed") or 0) for t in taken)
        reasons = [str(t.get("action_reason") or "") for t in taken]
        condition = cast(LineCondition, next((r for r in reasons if r in _CONDITIONS), "unknown"))
        lines.append(
            ReturnLine(
                description=clip(str(item.get("name") or ""), MAX_TEXT_CHARS),
                quantity=int(item.get("quantity") or 0),
                amount=_amount(item.get("amount_paid", 0)),
                received=processed > 0,
                condition=condition if processed > 0 else "unknown",
            )
        )
    return ReturnReceipt(
        order_id=order_id,
        rma_id=str(ret.get("id") or ""),
        status=_RETURN_STATUSES.get(str(ret.get("status")), "none"),
        currency=str((ret.get("invoice") or {}).get("currency_code") or "").upper(),
        label_created_at=_time(ret.get("awaiting_arrival_date")) or _time(ret.get("insert_date")),
        shipped_at=history.get("InTransit"),
        received_at=_time(ret.get("arrived_date")),
        lines=lines,
    )


def _stripe_attempt(call: Any) -> Any:
    """One Stripe call, its transient failures marked for ``retrying`` and the rest made permanent."""
    try:
        return call()
    except (stripe.APIConnectionError, stripe.RateLimitError) as error:
        raise Transient(type(error).__name__) from None
    except stripe.StripeError as error:
        status = error.http_status
        if status is None or status >= 500:
            raise Transient(f"HTTP {status}") from None
        raise EvidenceUnavailable(f"payments: HTTP {status}") from None


@DBOS.step(name=PAYMENT_RISK_STEP)
def payment_risk_step(charge_id: str) -> RiskSignals:
    """The charge's early fraud warnings and disputes at the payment provider (Stripe's two list endpoints)."""
    cfg = config()
    client = stripe_client(cfg.stripe_api_key, cfg.stripe_base_url)
    efw = client.v1.radar.early_fraud_warnings
    warnings = retrying("payments", lambda: _stripe_attempt(lambda: efw.list({"charge": charge_id, "limit": 100})))
    disputes = retrying(
        "payments", lambda: _stripe_attempt(lambda: client.v1.disputes.list({"charge": charge_id, "limit": 100}))
    )
    return RiskSignals(
        charge_id=charge_id,
        early_fraud_warnings=[
            FraudWarning(
                warning_id=w.id,
                fraud_type=str(w.fraud_type),
                actionable=bool(w.actionable),
                created=datetime.fromtimestamp(int(w.created), UTC),
            )
            for w in warnings.data
        ],
        disputes=[
            Dispute(
                dispute_id=d.id,
                # A status this code does not know yet is taken as still open: a person looks at it.
                status=d.status if d.status in _DISPUTE_STATUSES else "under_review",
                reason=str(d.reason),
                amount=from_minor(int(d.amount), str(d.currency).upper()),
                currency=str(d.currency).upper(),
                created=datetime.fromtimestamp(int(d.created), UTC),
            )
            for d in disputes.data
        ],
    )


def _role(value: Any) -> AuthorRole:
    """An author whose role is not given is not taken for the support team."""
    return cast(AuthorRole, value) if value in _ROLES else "end-user"


@DBOS.step(name=TICKET_HISTORY_STEP)
def ticket_history_step(email: str) -> TicketHistory:
    """The customer's earlier tickets, newest first: a Zendesk search by requester, then each ticket's comments
    with their authors' roles (users sideloaded). At most ``MAX_TICKETS`` tickets, each with its last
    ``MAX_COMMENTS`` comments (oldest first, as a conversation reads), bodies clipped to ``MAX_COMMENT_CHARS``."""
    cfg = config()
    auth = (f"{cfg.tickets_email}/token", cfg.tickets_api_token)
    base = f"{cfg.tickets_base_url}/api/v2"
    query = {"query": f'type:ticket requester:"{email}"', "sort_by": "created_at", "sort_order": "desc"}
    found = call_json("tickets", "GET", f"{base}/search.json", auth=auth, params=query)
    results = [t for t in (found or {}).get("results", []) if isinstance(t, dict) and _time(t.get("created_at"))]
    results.sort(key=lambda t: _time(t.get("created_at")) or datetime.min.replace(tzinfo=UTC), reverse=True)
    tickets = []
    for ticket in results[:MAX_TICKETS]:
        created = _time(ticket.get("created_at")) or datetime.now(UTC)
        url = f"{base}/tickets/{int(ticket['id'])}/comments.json"
        page = call_json("tickets", "GET", url, auth=auth, params={"include": "users"}, not_found=True) or {}
        roles = {u.get("id"): u.get("role") for u in page.get("users", [])}
        comments = [
            TicketComment(
                author_role=_role(roles.get(c.get("author_id"))),
                body=clip(str(c.get("body") or ""), MAX_COMMENT_CHARS),
                at=_time(c.get("created_at")) or created,
            )
            for c in page.get("comments", [])
        ]
        comments.sort(key=lambda c: c.at)
        tickets.append(
            Ticket(
                ticket_id=str(ticket["id"]),
                subject=clip(str(ticket.get("subject") or ""), MAX_TEXT_CHARS),
                status=str(ticket.get("status") or ""),
                created_at=created,
                comments=comments[-MAX_COMMENTS:],
            )
        )
    return TicketHistory(email=email, tickets=tickets)
