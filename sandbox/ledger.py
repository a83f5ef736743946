"""Storage for the sandbox payments service: charges, refunds, idempotency keys, events and counters.

Several sandbox processes (and threads) share one database (sandbox/ledger_tables.py) and still agree on
idempotency, what is left on a charge, and statistics; what it keeps and answers is sandbox/ledger_records.py.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from sandbox.ledger_records import Charge, Claimed, ClaimResult, Conflict, Refund, Refused, Replay, Settled
from sandbox.ledger_tables import (
    CHARGEBACK_OPEN,
    charges,
    counters,
    events,
    idempotency_keys,
    make_engine,
    metadata,
    refunds,
    risk_signals,
)

logger = logging.getLogger(__name__)

COUNTERS = ("create_requests", "refunds_applied", "replays", "faults_injected", "refunds_failed", "events_delivered")
_PG_SCHEMA_LOCK = 0x5A4E_D80C  # arbitrary advisory-lock id serialising concurrent create_all on Postgres
#: Refunds that count against what is left on a charge (a failed or canceled refund gives it back).
_HOLDING = ("pending", "requires_action", "succeeded")
#: The Stripe API version the sandbox's objects and events follow.
API_VERSION = "2025-03-31.basil"


class Ledger:
    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)
        self._pg = self.engine.dialect.name == "postgresql"

    def create_tables(self) -> None:
        with self.engine.begin() as conn:
            if self._pg:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SCHEMA_LOCK})
            columns = (
                {c["name"] for c in sa.inspect(conn).get_columns("sandbox_refunds")}
                if sa.inspect(conn).has_table("sandbox_refunds")
                else None
            )
            if columns is not None and "failure_reason" not in columns:
                # A ledger from before charges were modelled: it is a sandbox, so start it afresh.
                logger.warning("sandbox ledger predates charges; dropping its tables")
                for name in ("sandbox_refund_metadata", "sandbox_refunds", "sandbox_idempotency_keys"):
                    conn.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
            metadata.create_all(conn)
        logger.info("sandbox ledger ready at %s", self.engine.url.render_as_string(hide_password=True))

    def close(self) -> None:
        self.engine.dispose()

    def _insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    def _bump(self, conn: Connection, name: str, n: int) -> None:
        stmt = self._insert(counters).values(name=name, value=n)
        conn.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"value": counters.c.value + n}))

    def bump(self, name: str, n: int = 1) -> None:
        with self.engine.begin() as conn:
            self._bump(conn, name, n)

    def stats(self) -> dict[str, int]:
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(counters.c.name, counters.c.value)).all()
        found = {str(r.name): int(r.value) for r in rows}
        return {name: found.get(name, 0) for name in COUNTERS}

    # -- charges -------------------------------------------------------------------------------------

    def add_charges(self, new: Iterable[Charge]) -> list[Charge]:
        """Create charges that do not exist yet (by id); returns every given charge as stored."""
        stored: list[Charge] = []
        with self.engine.begin() as conn:
            for charge in new:
                conn.execute(self._insert(charges).values(**asdict(charge)).on_conflict_do_nothing())
                row = conn.execute(sa.select(charges).where(charges.c.id == charge.id)).one()
                stored.append(Charge(**row._mapping))
        return stored

    def get_charge(self, charge_id: str) -> Charge | None:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(charges).where(charges.c.id == charge_id)).one_or_none()
        return None if row is None else Charge(**row._mapping)

    def charge_of_payment_intent(self, payment_intent: str) -> Charge | None:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(charges).where(charges.c.payment_intent == payment_intent)).one_or_none()
        return None if row is None else Charge(**row._mapping)

    # -- idempotency keys ----------------------------------------------------------------------------

    def claim_key(
        self, key: str, fingerprint: str, *, now: float, ttl_seconds: float, stale_after_seconds: float
    ) -> ClaimResult:
        """Atomically claim `key` (unique-key insert) or report what it already holds."""
        token = secrets.token_hex(16)
        fresh = dict(fingerprint=fingerprint, token=token, state="in_flight", claimed_at=now)
        fresh |= dict(response_status=None, response_body=None)
        keys = idempotency_keys
        for _ in range(10):  # the row may be released between our insert attempt and our read: retry
            with self.engine.begin() as conn:
                # RETURNING, not rowcount: SQLAlchemy only guarantees rowcount for UPDATE/DELETE.
                insert = self._insert(keys).values(key=key, **fresh).on_conflict_do_nothing()
                if conn.execute(insert.returning(keys.c.key)).first() is not None:
                    return Claimed(token)
                row = conn.execute(sa.select(keys).where(keys.c.key == key)).one_or_none()
                if row is None:
                    continue
                age = now - row.claimed_at
                # A crashed holder must not pin the key forever; the token check when saving keeps
                # a slow-but-alive holder from committing after being taken over.
                expired = age >= ttl_seconds or (row.state == "in_flight" and age >= stale_after_seconds)
                if not expired:
                    if row.state == "in_flight":
                        return Conflict("in_flight")
                    if row.fingerprint != fingerprint:
                        return Conflict("mismatch")
                    return Replay(int(row.response_status), str(row.response_body))
                retaken = conn.execute(
                    sa.update(keys).where(keys.c.key == key, keys.c.token == row.token).values(**fresh)
                )
                if retaken.rowcount == 1:
                    return Claimed(token)
        raise RuntimeError("could not claim idempotency key: too much contention")

    def release_key(self, key: str, token: str) -> None:
        keys = idempotency_keys
        with self.engine.begin() as conn:
            conn.execute(sa.delete(keys).where(keys.c.key == key, keys.c.token == token, keys.c.state == "in_flight"))

    def _save(self, conn: Connection, claim: tuple[str, str] | None, status: int, body: str) -> bool:
        if claim is None:
            return True
        keys, (key, token) = idempotency_keys, claim
        done = conn.execute(
            sa.update(keys)
            .where(keys.c.key == key, keys.c.token == token, keys.c.state == "in_flight")
            .values(state="done", response_status=status, response_body=body)
        )
        return done.rowcount == 1

    def save_response(self, claim: tuple[str, str], status: int, body: str) -> bool:
        """Store a response for the key without applying anything (Stripe's saved errors)."""
        with self.engine.begin() as conn:
            return self._save(conn, claim, status, body)

    # -- refunds -------------------------------------------------------------------------------------

    def apply_refund(self, refund: Refund, *, claim: tuple[str, str] | None) -> Refund | Refused | None:
        """Take the refund from what is left on its charge and save the key's response, in one transaction.

        Returns the refund, Stripe's refusal (also saved for the key), or None, applying nothing, when the
        claim (key, token) was taken over meanwhile or the charge does not exist (nothing is saved then).
        """
        with self.engine.connect() as conn:  # explicit commit: a lost claim must roll back everything
            query = sa.select(charges).where(charges.c.id == refund.charge)
            row = conn.execute(query.with_for_update() if self._pg else query).one_or_none()
            if row is None:
                conn.rollback()
                return Refused("resource_missing", f"No such charge: '{refund.charge}'")
            charge = Charge(**row._mapping)
            left = charge.amount - charge.amount_refunded
            refused: Refused | None = None
            if self._charged_back(conn, charge.id):
                refused = Refused("charge_disputed", f"Charge {charge.id} has been charged back.", None)
            elif left <= 0:
                refused = Refused("charge_already_refunded", f"Charge {charge.id} has already been refunded.")
            elif refund.amount > left:
                message = f"Refund amount ({refund.amount}) is greater than unrefunded amount on charge ({left})"
                refused = Refused("amount_too_large", message)
            if refused is not None:
                error = {"type": "invalid_request_error", "code": refused.code, "message": refused.message}
                if refused.param is not None:
                    error["param"] = refused.param
                if not self._save(conn, claim, 400, json.dumps({"error": error})):
                    conn.rollback()
                    return None
                conn.commit()
                return refused
            refund = Refund(**(asdict(refund) | {"currency": charge.currency, "payment_intent": charge.payment_intent}))
            if not self._save(conn, claim, 200, json.dumps(refund.to_stripe())):
                conn.rollback()
                return None
            values = {k: v for k, v in asdict(refund).items() if k != "metadata"}
            conn.execute(refunds.insert().values(**values, metadata_json=json.dumps(refund.metadata)))
            conn.execute(
                sa.update(charges)
                .where(charges.c.id == charge.id)
                .values(amount_refunded=charges.c.amount_refunded + refund.amount)
            )
            self._bump(conn, "refunds_applied", 1)
            conn.commit()
        return refund

    def _charged_back(self, conn: Connection, charge_id: str) -> bool:
        """Whether the charge has an open dispute that is not an inquiry (its funds are held by the dispute)."""
        query = sa.select(risk_signals.c.body).where(
            risk_signals.c.kind == "dispute", risk_signals.c.charge == charge_id
        )
        return any(json.loads(body).get("status") in CHARGEBACK_OPEN for body in conn.execute(query).scalars())

    def get_refund(self, refund_id: str) -> Refund | None:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(refunds).where(refunds.c.id == refund_id)).one_or_none()
        return None if row is None else _to_refund(row)

    def list_refunds(
        self,
        *,
        charge: str | None = None,
        payment_intent: str | None = None,
        created: dict[str, int] | None = None,
        limit: int = 10,
        starting_after: str | None = None,
        ending_before: str | None = None,
    ) -> tuple[list[Refund], bool]:
        """Newest first, by Stripe's filters only; returns (page, has_more)."""
        query = sa.select(refunds)
        if charge is not None:
            query = query.where(refunds.c.charge == charge)
        if payment_intent is not None:
            query = query.where(refunds.c.payment_intent == payment_intent)
        ops = {"gt": "__gt__", "gte": "__ge__", "lt": "__lt__", "lte": "__le__", "eq": "__eq__"}
        for op, value in (created or {}).items():
            query = query.where(getattr(refunds.c.created, ops[op])(value))
        order = refunds.c.seq.desc()
        if starting_after is not None:
            cursor = sa.select(refunds.c.seq).where(refunds.c.id == starting_after).scalar_subquery()
            query = query.where(refunds.c.seq < cursor)
        elif ending_before is not None:
            cursor = sa.select(refunds.c.seq).where(refunds.c.id == ending_before).scalar_subquery()
            query, order = query.where(refunds.c.seq > cursor), refunds.c.seq.asc()
        with self.engine.begin() as conn:
            rows = conn.execute(query.order_by(order).limit(limit + 1)).all()
        page = [_to_refund(r) for r in rows[:limit]]
        return (page[::-1] if ending_before is not None and starting_after is None else page), len(rows) > limit

    def count_refunds(self, *, charge: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(refunds)
        if charge is not None:
            query = query.where(refunds.c.charge == charge)
        with self.engine.begin() as conn:
            return int(conn.execute(query).scalar_one())

    def settle(self, refund_id: str, to: str, failure_reason: str | None, *, now: float) -> Settled | None:
        """Move a pending refund to ``to`` (succeeded, failed or canceled) and queue its event, once.

        None when it is not pending (settled already, by the clock or by hand)."""
        return self._move(refund_id, ("pending", "requires_action"), to, failure_reason, now=now)

    def fail_succeeded(self, refund_id: str, failure_reason: str, *, now: float) -> Settled | None:
        """Fail a refund that had succeeded, as Stripe may (the bank returned it): the charge gets the amount
        back and a ``refund.failed`` event is queued, once. None when it is not ``succeeded``."""
        return self._move(refund_id, ("succeeded",), "failed", failure_reason, now=now)

    def _move(
        self, refund_id: str, from_: tuple[str, ...], to: str, failure_reason: str | None, *, now: float
    ) -> Settled | None:
        with self.engine.begin() as conn:
            moved = conn.execute(
                sa.update(refunds)
                .where(refunds.c.id == refund_id, refunds.c.status.in_(from_))
                .values(status=to, failure_reason=failure_reason if to == "failed" else None, settle_at=None)
            )
            if moved.rowcount != 1:
                return None
            refund = _to_refund(conn.execute(sa.select(refunds).where(refunds.c.id == refund_id)).one())
            if to not in _HOLDING:  # the money goes back on the charge
                conn.execute(
                    sa.update(charges)
                    .where(charges.c.id == refund.charge)
                    .values(amount_refunded=charges.c.amount_refunded - refund.amount)
                )
                self._bump(conn, "refunds_failed", 1)
            event_type = "refund.failed" if to == "failed" else "refund.updated"
            event_id = f"evt_{secrets.token_hex(12)}"
            payload = {
                "id": event_id,
                "object": "event",
                "api_version": API_VERSION,
                "created": int(now),
                "livemode": False,
                "pending_webhooks": 1,
                "request": {"id": None, "idempotency_key": None},
                "type": event_type,
                "data": {"object": refund.to_stripe()},
            }
            conn.execute(
                events.insert().values(
                    id=event_id, type=event_type, payload=json.dumps(payload), attempts=0, delivered=False
                )
            )
        return Settled(refund, event_type)

    def due_settlements(self, now: float) -> list[Refund]:
        query = sa.select(refunds).where(refunds.c.status == "pending", refunds.c.settle_at <= now)
        with self.engine.begin() as conn:
            return [_to_refund(r) for r in conn.execute(query.order_by(refunds.c.seq).limit(100)).all()]

    def has_pending_settlements(self) -> bool:
        """A refund is pending with a time to settle (due or not)."""
        query = sa.select(sa.exists().where(refunds.c.status == "pending", refunds.c.settle_at.is_not(None)))
        with self.engine.begin() as conn:
            return bool(conn.execute(query).scalar_one())

    # -- events --------------------------------------------------------------------------------------

    def undelivered_events(self, max_attempts: int) -> list[tuple[str, str, dict[str, Any]]]:
        query = sa.select(events).where(events.c.delivered.is_(False), events.c.attempts < max_attempts)
        with self.engine.begin() as conn:
            rows = conn.execute(query.order_by(events.c.seq).limit(100)).all()
        return [(str(r.id), str(r.type), json.loads(r.payload)) for r in rows]

    def mark_event(self, event_id: str, *, delivered: bool) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(events)
                .where(events.c.id == event_id)
                .values(attempts=events.c.attempts + 1, delivered=delivered)
            )
            if delivered:
                self._bump(conn, "events_delivered", 1)

    def list_events(self) -> list[dict[str, Any]]:
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(events).order_by(events.c.seq)).all()
        return [json.loads(r.payload) | {"attempts": r.attempts, "delivered": r.delivered} for r in rows]


def _to_refund(row: sa.Row[Any]) -> Refund:
    values = {k: v for k, v in row._mapping.items() if k not in ("seq", "metadata_json")}
    return Refund(**values, metadata=json.loads(row.metadata_json))
