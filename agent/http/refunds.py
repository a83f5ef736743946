"""HTTP routes for refunds and orders: validate, then hand over to the workflow. Thin on purpose."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Header, Query, Response
from pydantic import BaseModel, ValidationError

from agent import policy, tokens
from agent.conversation import conversation
from agent.decision_checks import is_requester
from agent.domain import RefundRequest
from agent.http.clients import current_client, principal_of, requiring, sees_every_refund
from agent.http.openapi import GUARDED, errors
from agent.http.problems import Problem, describe
from agent.http.refund_input import RefundIn
from agent.http.views import ConversationView, OrderPage, RefundPage, RefundView, Status
from agent.services import Services, ServicesDep
from agent.status import amounts_refunded, minor_text, refund_status, rfc3339
from agent.submit import KEY_PATTERN, SubmissionError, submit_refund
from steps.orders import list_orders
from steps.records import ApiClient, from_minor, quantize
from steps.refunds import Requester
from steps.store import app_db, refunds

# Every route here needs an API client's key (agent/http/clients.py); each route names the scopes it needs.
router = APIRouter(dependencies=[Depends(current_client)])
Creator = Annotated[ApiClient, Depends(requiring("refunds:create"))]
Reader = Annotated[ApiClient, Depends(requiring("refunds:read", "approvals:decide"))]
OrderReader = Annotated[ApiClient, Depends(requiring("refunds:create", "refunds:read"))]


class Accepted(BaseModel):
    refund_id: str
    status: Status
    status_url: str


@router.post(
    "/refunds",
    status_code=202,
    response_model=Accepted,
    tags=["refunds"],
    responses={
        200: {"model": Accepted, "description": "the same key and body again: the refund already accepted"},
        **errors(
            *GUARDED,
            400,
            404,
            409,
            413,
            415,
            422,
            e400="no `Idempotency-Key`, or a malformed one",
            e403="the client lacks `refunds:create`",
            e404="no order with that id",
            e409="the key was used before with another body, or by another client",
            e422="a body that breaks a rule (said in plain words): an amount that is not a positive decimal string, "
            "more decimals than the currency has, more than was paid, another currency than the order's, an "
            "empty message, an unknown field; malformed JSON (with its line and column)",
        ),
    },
)
def create_refund(
    body: RefundIn,
    svc: ServicesDep,
    client: Creator,
    response: Response,
    idempotency_key: Annotated[
        str,
        Header(
            alias="Idempotency-Key",
            description="Required (400 without it): 8-200 letters, digits or `_.:-`; becomes the refund id. The "
            "same key with the same body returns the same refund (200); with another body, 409.",
            examples=["order-1001-2026-12-02"],
            json_schema_extra={"pattern": KEY_PATTERN},
        ),
    ],
) -> Accepted:
    """Accept a refund request; the Idempotency-Key becomes the refund id (and the workflow id). 202 when new."""
    try:
        request = RefundRequest(
            order_id=body.order_id,
            message=body.message,
            amount=Decimal(body.amount) if body.amount else None,
            currency=body.currency,
        )
    except ValidationError as error:
        raise Problem(422, "; ".join(describe(e) for e in error.errors())) from error
    try:
        sub = submit_refund(
            svc.client,
            idempotency_key=idempotency_key,
            request=request,
            requester=Requester(principal=str(principal_of(client)), operator=client.operator),
        )
    except SubmissionError as error:
        raise Problem(error.status, str(error)) from error
    if not sub.created:
        response.status_code = 200
    status = refund_status(svc.client, sub.refund_id)
    return Accepted(
        refund_id=sub.refund_id,
        status=status["status"] if status else "received",
        status_url=f"/refunds/{sub.refund_id}",
    )


def _visible(client: ApiClient, status: dict[str, Any]) -> bool:
    return sees_every_refund(client) or status.get("requested_by") == str(principal_of(client))


def _with_links(svc: Services, client: ApiClient, status: dict[str, Any]) -> dict[str, Any]:
    """A client that may decide, and did not request the refund, gets an approval link bound to itself.

    Nobody else sees a link: not the requester (who could otherwise approve its own refund), not a client
    that may only read."""
    approval: dict[str, Any] = status.get("approval") or {}
    request = approval.get("request") if approval.get("decision") is None else None
    me = str(principal_of(client))
    requester = is_requester(principal_of(client), status.get("requested_by"), status.get("requester_operator"))
    may_decide = client.allows("approvals:decide") and not requester
    if request and status["status"] == "awaiting_approval" and may_decide:
        claims = tokens.ApprovalClaims(
            refund_id=status["refund_id"],
            amount=Decimal(request["amount"]),
            currency=request["currency"],
            expires_at=datetime.fromisoformat(request["expires_at"]),
            approver=me,
        )
        token = tokens.sign(claims, svc.signing_secret)
        base = svc.settings.server.base_url.rstrip("/")
        approval["token"] = token
        approval["approve_url"] = f"{base}/approve/{token}?decision=approve"
        approval["reject_url"] = f"{base}/approve/{token}?decision=reject"
    return status


# exclude_unset: the approval's token and links are absent (not null) for a client that may not decide the refund
@router.get(
    "/refunds/{refund_id}",
    response_model=RefundView,
    response_model_exclude_unset=True,
    tags=["refunds"],
    responses=errors(*GUARDED, 404, e404="no refund with that id, or one a `refunds:read` client did not request"),
)
def get_refund(refund_id: str, svc: ServicesDep, client: Reader) -> dict[str, Any]:
    """Status, amounts, approval, payment and the DBOS step timeline of one refund.

    A client with ``refunds:read`` only reads the refunds it requested (any other is 404)."""
    status = refund_status(svc.client, refund_id, prices=svc.settings.model.prices)
    if status is None or not _visible(client, status):
        raise Problem(404, f"no refund {refund_id}")
    return _with_links(svc, client, status)


@router.get(
    "/refunds/{refund_id}/conversation",
    response_model=ConversationView,
    tags=["refunds"],
    responses=errors(*GUARDED, 404, e404="no refund with that id, or one a `refunds:read` client did not request"),
)
def get_conversation(refund_id: str, svc: ServicesDep, client: Reader) -> ConversationView:
    """The refund's conversation with its customer, oldest first: the request, each message the customer was sent
    (with its delivery state), and what they wrote back on the help-desk ticket.

    Messages to approvers are not part of it. A client with ``refunds:read`` only reads the refunds it requested."""
    status = refund_status(svc.client, refund_id)
    if status is None or not _visible(client, status):
        raise Problem(404, f"no refund {refund_id}")
    with app_db().engine.connect() as conn:
        found = conversation(conn, svc.client, refund_id)
    if found is None:
        raise Problem(404, f"no refund {refund_id}")
    return ConversationView.of(found)


def _cursor(created: datetime, refund_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created.isoformat(), refund_id]).encode()).decode()


def _uncursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, refund_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if "\x00" in str(refund_id):
            raise ValueError("NUL in cursor")
        return datetime.fromisoformat(created), str(refund_id)
    except (ValueError, TypeError) as error:
        raise Problem(400, "cursor is not one this API returned") from error


@router.get(
    "/refunds",
    response_model=RefundPage,
    tags=["refunds"],
    responses=errors(*GUARDED, 400, 422, e400="a cursor this API did not return", e422="an unknown status or limit"),
)
def list_refunds(
    svc: ServicesDep,
    client: Reader,
    status: Status | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Refunds, newest first, a page at a time (pass ``next_cursor`` back as ``cursor``)."""
    query = sa.select(refunds).order_by(refunds.c.created_at.desc(), refunds.c.refund_id.desc()).limit(limit + 1)
    if status is not None:
        query = query.where(refunds.c.status == status)
    if not sees_every_refund(client):
        query = query.where(refunds.c.requested_by == str(principal_of(client)))
    if cursor:
        created, refund_id = _uncursor(cursor)
        query = query.where(
            sa.or_(
                refunds.c.created_at < created,
                sa.and_(refunds.c.created_at == created, refunds.c.refund_id < refund_id),
            )
        )
    with app_db().engine.connect() as conn:
        rows = list(conn.execute(query))
        page = rows[:limit]
        paid = amounts_refunded(conn, page)
    items = [
        {
            "refund_id": r.refund_id,
            "status": r.status,
            "order_id": r.order_id,
            "currency": r.currency,
            "amount": str(from_minor(m, r.currency))
            if (m := r.proposed_amount_minor or r.requested_amount_minor)
            else None,
            "amount_requested": minor_text(r.requested_amount_minor, r.currency),
            "amount_refunded": str(paid[r.refund_id]) if r.refund_id in paid else None,
            "created_at": rfc3339(r.created_at),
        }
        for r in page
    ]
    more = len(rows) > limit
    return {"items": items, "next_cursor": _cursor(page[-1].created_at, page[-1].refund_id) if more else None}


@router.get("/orders", response_model=OrderPage, tags=["orders"], responses=errors(*GUARDED, 422))
def get_orders(
    svc: ServicesDep,
    client: OrderReader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Orders with what policy would allow refunding now."""
    now = datetime.now(UTC)
    with app_db().engine.connect() as conn:
        page = list_orders(conn, limit=limit + 1, after=cursor)
    items = [
        {
            "order_id": o.order_id,
            "customer_id": o.customer_id,
            "currency": o.currency,
            "amount_captured": str(o.amount_captured),
            "amount_refunded": str(o.amount_refunded),
            "status": o.status,
            "refundable": str(quantize(policy.refundable(o, now, svc.limits.window_days), o.currency)),
        }
        for o in page[:limit]
    ]
    return {"items": items, "next_cursor": page[limit - 1].order_id if len(page) > limit else None}
