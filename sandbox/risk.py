"""Risk signals on charges in the payments sandbox: Stripe Radar early fraud warnings and disputes.

Stored in the ledger's database (so several sandbox processes serve the same signals), seeded from a
``RiskSeed`` at start and by ``PUT /_sandbox/risk``, and served as Stripe's list endpoints
``GET /v1/radar/early_fraud_warnings`` and ``GET /v1/disputes`` filtered by ``charge``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Request

from sandbox.evidence_seed import RiskSeed
from sandbox.ledger import Ledger
from sandbox.ledger_tables import CHARGEBACK_OPEN, risk_signals
from sandbox.stripe_api import invalid

Kind = Literal["early_fraud_warning", "dispute"]
_PG_RISK_LOCK = 0x5A4E_D80D  # serialises concurrent replacements on Postgres


def _id(prefix: str, *parts: object) -> str:
    return prefix + hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:24]


def render(seed: RiskSeed, now: datetime) -> list[tuple[Kind, dict[str, Any]]]:
    """Stripe's objects for ``seed``, with times fixed from ``now``; ids are stable for the same seed."""
    objects: list[tuple[Kind, dict[str, Any]]] = []
    for n, w in enumerate(seed.early_fraud_warnings):
        objects.append(
            (
                "early_fraud_warning",
                {
                    "id": _id("issfr_", w.charge, n, w.fraud_type),
                    "object": "radar.early_fraud_warning",
                    "actionable": w.actionable,
                    "charge": w.charge,
                    "created": int(w.created.at(now).timestamp()),
                    "fraud_type": w.fraud_type,
                    "livemode": False,
                    "payment_intent": None,
                },
            )
        )
    for n, d in enumerate(seed.disputes):
        created = int(d.created.at(now).timestamp())
        objects.append(
            (
                "dispute",
                {
                    "id": _id("dp_", d.charge, n, d.reason),
                    "object": "dispute",
                    "amount": d.amount,
                    "currency": d.currency,
                    "charge": d.charge,
                    "created": created,
                    "reason": d.reason,
                    "status": d.status,
                    "is_charge_refundable": d.status not in CHARGEBACK_OPEN,
                    "livemode": False,
                    "metadata": {},
                    "payment_intent": None,
                    "balance_transactions": [],
                    "evidence_details": {
                        "due_by": created + 7 * 86400,
                        "has_evidence": False,
                        "past_due": False,
                        "submission_count": 0,
                    },
                },
            )
        )
    return objects


def replace(ledger: Ledger, seed: RiskSeed, now: datetime | None = None) -> int:
    """Replace every risk signal with ``seed``'s; returns how many there are."""
    objects = render(seed, now or datetime.now(UTC))
    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "postgresql":  # sandboxes sharing one database may start at once
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_RISK_LOCK})
        conn.execute(risk_signals.delete())
        for kind, body in objects:
            values = {"id": body["id"], "kind": kind, "charge": body["charge"], "created": body["created"]}
            conn.execute(risk_signals.insert().values(**values, body=json.dumps(body)))
    return len(objects)


def listing(ledger: Ledger, kind: Kind, charge: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    query = sa.select(risk_signals.c.body).where(risk_signals.c.kind == kind)
    if charge is not None:
        query = query.where(risk_signals.c.charge == charge)
    query = query.order_by(risk_signals.c.created.desc(), risk_signals.c.id).limit(limit + 1)
    with ledger.engine.begin() as conn:
        rows = [json.loads(r.body) for r in conn.execute(query)]
    return rows[:limit], len(rows) > limit


def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


#: Stripe's two list endpoints and the admin seed endpoint; the payments sandbox includes them behind its auth.
router = APIRouter()
AppLedger = Annotated[Ledger, Depends(_ledger)]


def _list_of(ledger: Ledger, kind: Kind, url: str, request: Request) -> dict[str, Any]:
    params = dict(request.query_params)
    unknown = set(params) - {"charge", "payment_intent", "limit", "starting_after", "ending_before"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(f"Received unknown parameter: {name}", name)
    limit_text = params.get("limit", "10")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 100:
        raise invalid("limit must be an integer between 1 and 100.", "limit")
    data, has_more = listing(ledger, kind, params.get("charge"), int(limit_text))
    return {"object": "list", "data": data, "has_more": has_more, "url": url}


@router.get("/v1/radar/early_fraud_warnings")
def list_early_fraud_warnings(request: Request, ledger: AppLedger) -> dict[str, Any]:
    return _list_of(ledger, "early_fraud_warning", "/v1/radar/early_fraud_warnings", request)


@router.get("/v1/disputes")
def list_disputes(request: Request, ledger: AppLedger) -> dict[str, Any]:
    return _list_of(ledger, "dispute", "/v1/disputes", request)


@router.put("/_sandbox/risk")
def put_risk(new: RiskSeed, ledger: AppLedger) -> dict[str, int]:
    """Replace the early fraud warnings and disputes; times are fixed from this moment."""
    return {"signals": replace(ledger, new)}
