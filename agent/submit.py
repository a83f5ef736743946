"""Accepting a refund request: validate, claim its idempotency key, enqueue its workflow."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from dbos import DBOSClient, EnqueueOptions

from agent.domain import RefundRequest
from steps.orders import get_order
from steps.records import Order, minor_unit_problem
from steps.refunds import Requester, register_request
from steps.store import app_db

KEY_PATTERN = r"^[A-Za-z0-9_.:-]{8,200}$"
"""What an Idempotency-Key may be: it becomes the refund id and every workflow id of the refund."""
_KEY = re.compile(KEY_PATTERN)


class SubmissionError(Exception):
    """A request that cannot be accepted; ``status`` is the HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Submission:
    refund_id: str
    created: bool


def request_hash(request: RefundRequest) -> str:
    body = request.model_dump(mode="json")
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def checked_request(request: RefundRequest, order: Order | None) -> RefundRequest:
    """The request as its workflow gets it (currency filled in), or the reason it cannot be accepted."""
    if order is None:
        raise SubmissionError(404, f"order {request.order_id} does not exist")
    if request.currency is not None and request.currency != order.currency:
        raise SubmissionError(422, f"currency {request.currency} does not match the order's {order.currency}")
    if request.amount is not None and (problem := minor_unit_problem(request.amount, order.currency)):
        raise SubmissionError(422, problem)
    if request.amount is not None and request.amount > order.amount_captured:
        raise SubmissionError(422, f"amount {request.amount} is more than the {order.amount_captured} paid")
    return request.model_copy(update={"currency": order.currency})


def submit_refund(
    client: DBOSClient,
    *,
    idempotency_key: str,
    request: RefundRequest,
    requester: Requester,
    app_version: str | None = None,
) -> Submission:
    """Start the refund once per key. The same key and body returns it again; a new body is a conflict, and
    so is the same key from another requester (a key belongs to whoever used it first).

    ``requester`` is who the channel established (an API client, the OS user of the command line): it is
    recorded with the refund, and may never decide it.

    Without ``app_version`` the refund is version-less: a worker of the latest release deployed takes it,
    so a refund accepted just before an upgrade is not left to workers of a release that is gone."""
    from agent.workflow import REFUND_QUEUE, REFUND_WORKFLOW

    if not _KEY.match(idempotency_key):
        raise SubmissionError(400, "Idempotency-Key must be 8-200 letters, digits or _.:-")
    with app_db().engine.connect() as conn:
        order = get_order(conn, request.order_id)
    request = checked_request(request, order)
    digest = request_hash(request)
    claim = register_request(
        refund_id=idempotency_key,
        order_id=request.order_id,
        request_hash=digest,
        currency=str(request.currency),  # filled in from the order by checked_request
        requested=request.amount,
        requester=requester,
    )
    if claim.requested_by is not None and claim.requested_by != requester.principal:
        raise SubmissionError(409, "this Idempotency-Key was already used by another client")
    if claim.request_hash != digest:
        raise SubmissionError(409, "this Idempotency-Key was already used with a different request body")
    name = REFUND_WORKFLOW
    if not claim.created:  # a refund started before the case file runs on under its first name (agent.legacy)
        name = next((w.name for w in client.list_workflows(workflow_ids=[idempotency_key])), name)
    options: EnqueueOptions = {
        "queue_name": REFUND_QUEUE,
        "workflow_name": name,
        "workflow_id": idempotency_key,
    }
    if app_version is not None:
        options["app_version"] = app_version
    # Enqueued even when the key was claimed before: a crash between claim and enqueue heals here,
    # and enqueueing an existing workflow id attaches to it.
    client.enqueue(options, idempotency_key, request.model_dump(mode="json"))
    return Submission(refund_id=idempotency_key, created=claim.created)
