"""The system database's checkpoint rows: pickled ones rewritten as JSON, later ones never labelled pickle.

DBOS reads a row by the serializer it is labelled with, and a row labelled ``py_pickle`` is unpickled by DBOS
itself, whatever serializer the process has. So, after DBOS's own migration and before it launches (when it
recovers work and replays checkpoints), ``secure_checkpoints``:

- rewrites each pickled row a release that pickled left (refunds parked or in flight across the upgrade) as
  JSON, read through the trusted unpickler of ``checkpoints``; a row it refuses keeps its bytes but takes this
  serializer's label, so reading it raises instead of running it;
- installs a trigger on each table with a ``serialization`` column that gives any row written later with the
  pickle label (a worker of an older release, a planted row) this serializer's label, so DBOS never unpickles.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from agent.ops.checkpoints import NAME, PICKLE, SERIALIZER, CheckpointError, legacy_loads

log = logging.getLogger(__name__)

_GUARD = "refund_agent_no_pickle"
_LOCK = 7_361_029_044  # the advisory lock migrators take, so two starting processes do not race on the trigger


@dataclass(frozen=True)
class Table:
    name: str
    keys: tuple[str, ...]
    payloads: tuple[str, ...]
    labelled: bool = True
    """False: the workflow's ``workflow_status`` row carries the label (a workflow's inputs and result)."""


#: DBOS's tables that hold serialized values, with their keys and serialized columns; a workflow's inputs and
#: result before its status row, whose label says how they were written.
TABLES = (
    Table("workflow_input", ("workflow_uuid",), ("inputs",), labelled=False),
    Table("workflow_output", ("workflow_uuid",), ("output", "error"), labelled=False),
    Table("workflow_status", ("workflow_uuid",), ("inputs", "output", "error")),
    Table("operation_outputs", ("workflow_uuid", "function_id"), ("output", "error")),
    Table("notifications", ("message_uuid",), ("message",)),
    Table("workflow_events", ("workflow_uuid", "key"), ("value",)),
    Table("workflow_events_history", ("workflow_uuid", "function_id", "key"), ("value",)),
    Table("streams", ("workflow_uuid", "key", "offset"), ("value",)),
)


@dataclass(frozen=True)
class Converted:
    rewritten: int
    refused: int


def secure_checkpoints(engine: sa.Engine, *, schema: str = "dbos") -> Converted:
    """Rewrite pickled rows as JSON and install the relabelling trigger (idempotent; safe on every start).

    Once the trigger is on every table no pickle label can have been written since, so later starts neither scan
    the tables nor touch the trigger (which would lock DBOS's tables under running workers)."""
    sqlite = engine.dialect.name == "sqlite"
    prefix = "" if sqlite else f'"{schema}".'
    rewritten = refused = 0
    with engine.begin() as conn:
        if not sqlite:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
        if _guarded(conn, sqlite, schema):
            return Converted(0, 0)
        for table in TABLES:
            if table.labelled:
                (_install_sqlite_guard if sqlite else _install_postgres_guard)(conn, prefix, table)
            done, bad = _rewrite(conn, prefix, table)
            rewritten, refused = rewritten + done, refused + bad
    if rewritten or refused:
        log.warning("checkpoints: %d pickled rows rewritten as JSON, %d refused (left unreadable)", rewritten, refused)
    return Converted(rewritten, refused)


def _guarded(conn: sa.Connection, sqlite: bool, schema: str) -> bool:
    """Whether every table that carries a label has the relabelling trigger."""
    labelled = [t.name for t in TABLES if t.labelled]
    if sqlite:
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE :like"
        found = conn.execute(sa.text(query), {"like": f"{_GUARD}_%"}).scalar_one()
        return bool(found == 2 * len(labelled))
    query = (
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON t.tgrelid = c.oid "
        "JOIN pg_namespace n ON c.relnamespace = n.oid WHERE n.nspname = :schema AND t.tgname = :name"
    )
    return bool(conn.execute(sa.text(query), {"schema": schema, "name": _GUARD}).scalar_one() == len(labelled))


def _rewrite(conn: sa.Connection, prefix: str, table: Table) -> tuple[int, int]:
    columns = ", ".join(f'"{c}"' for c in (*table.keys, *table.payloads))
    pickled = "serialization = :pickle"
    if not table.labelled:
        pickled = f"workflow_uuid IN (SELECT workflow_uuid FROM {prefix}workflow_status WHERE {pickled})"  # noqa: S608
    rows = conn.execute(
        sa.text(f"SELECT {columns} FROM {prefix}{table.name} WHERE {pickled}"),  # noqa: S608
        {"pickle": PICKLE},
    ).all()
    rewritten = refused = 0
    for row in rows:
        keys = dict(zip(table.keys, row[: len(table.keys)], strict=True))
        values = dict(zip(table.payloads, row[len(table.keys) :], strict=True))
        for column, value in values.items():
            if value is None:
                continue
            try:
                values[column] = SERIALIZER.serialize(legacy_loads(value))
                rewritten += 1
            except (CheckpointError, TypeError) as e:
                # Left as it was but labelled ours: reading it raises (our reader refuses what it refused here).
                log.error("checkpoint %s %s %s refused: %s", table.name, keys, column, e)
                refused += 1
        sets = ", ".join([f'"{c}" = :v_{c}' for c in values] + (["serialization = :name"] if table.labelled else []))
        where = " AND ".join(f'"{c}" = :k_{c}' for c in keys)
        conn.execute(
            sa.text(f"UPDATE {prefix}{table.name} SET {sets} WHERE {where}"),  # noqa: S608
            {"name": NAME, **{f"v_{c}": v for c, v in values.items()}, **{f"k_{c}": v for c, v in keys.items()}},
        )
    return rewritten, refused


def _install_postgres_guard(conn: sa.Connection, prefix: str, table: Table) -> None:
    conn.execute(
        sa.text(
            f"CREATE OR REPLACE FUNCTION {prefix}{_GUARD}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF NEW.serialization = '{PICKLE}' THEN NEW.serialization := '{NAME}'; END IF; RETURN NEW; END $$"
        )
    )
    conn.execute(
        sa.text(
            f"CREATE OR REPLACE TRIGGER {_GUARD} BEFORE INSERT OR UPDATE ON {prefix}{table.name} "
            f"FOR EACH ROW EXECUTE FUNCTION {prefix}{_GUARD}()"
        )
    )


def _install_sqlite_guard(conn: sa.Connection, prefix: str, table: Table) -> None:
    for event in ("INSERT", "UPDATE OF serialization"):
        name = f"{_GUARD}_{table.name}_{event.split()[0].lower()}"
        conn.execute(
            sa.text(
                f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table.name} "  # noqa: S608
                f"WHEN NEW.serialization = '{PICKLE}' BEGIN "
                f"UPDATE {table.name} SET serialization = '{NAME}' WHERE rowid = NEW.rowid; END"
            )
        )
