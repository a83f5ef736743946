"""Checkpoints are data, not code: every step input and output in the system database is JSON a console can read,
old pickled checkpoints are read with the project's own types only, and a pickle planted in the database is
refused, never run (a planted payload that would write a marker file leaves no file)."""

from __future__ import annotations

import ast
import base64
import json
import os
import pickle
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSPortableJSONSerializer

from agent import approvals
from agent.approval_workflows import decide_here
from agent.approvals import family, settle_id
from agent.ops.checkpoint_store import secure_checkpoints
from agent.ops.checkpoints import NAME, PICKLE, SERIALIZER, CheckpointError, RecordedError, legacy_loads
from agent.ops.processes import wait_for
from agent.status import wait_for_outcome
from steps.payments import PaymentRefused
from steps.records import AuditEntry, Order, OrderSnapshot
from steps.refunds import PaymentPlan
from steps.store import create_engine
from tests.conftest import Env
from tests.identities import DANA
from tests.test_upgrade import as_the_pickling_release_left_it
from tests.test_workflow import parked, running, submit


class Planted:
    """What an attacker writes into a checkpoint: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def planted(marker: Path) -> str:
    return base64.b64encode(pickle.dumps(Planted(marker))).decode()


def system_rows(env: Env, table: str, refund_id: str) -> list[sa.RowMapping]:
    """Rows of a DBOS table over every workflow of a refund, read with plain SQL (as any console reads them)."""
    engine = create_engine(env.dbs.system_url)
    prefix = "" if env.backend == "sqlite" else "dbos."
    column = {"notifications": "destination_uuid"}.get(table, "workflow_uuid")
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    sa.text(f"SELECT * FROM {prefix}{table} WHERE {column} IN :ids").bindparams(  # noqa: S608
                        sa.bindparam("ids", expanding=True)
                    ),
                    {"ids": family(refund_id)},
                ).mappings()
            )
    finally:
        engine.dispose()


def execute(env: Env, sql: str, **params: Any) -> None:
    engine = create_engine(env.dbs.system_url)
    prefix = "" if env.backend == "sqlite" else "dbos."
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(sql.replace("{dbos}", prefix)), params)
    finally:
        engine.dispose()


#: Ours, and DBOS's portable JSON (which DBOS uses for its own timers).
JSON_FORMATS = {NAME, DBOSPortableJSONSerializer().name()}
PAYLOADS = {
    "workflow_input": ("inputs",),
    "workflow_output": ("output", "error"),
    "operation_outputs": ("output", "error"),
    "notifications": ("message",),
    "workflow_events": ("value",),
}


def test_every_checkpoint_of_an_approved_refund_is_json_naming_its_records(env: Env) -> None:
    with running(env) as client:
        refund_id = submit(client, "json-checkpoints-1", "ord_1002", "Please refund 150.00", amount=Decimal("150.00"))
        parked(client, refund_id)
        approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
        assert wait_for_outcome(client, refund_id)["status"] == "completed"
        wait_for(
            lambda: client.retrieve_workflow(settle_id(refund_id)).get_status().status == "SUCCESS",
            timeout=60,
            what="settling",
        )

    assert {r["serialization"] for r in system_rows(env, "workflow_status", refund_id)} == {NAME}
    seen: dict[str, int] = {}
    for table, columns in PAYLOADS.items():
        for row in system_rows(env, table, refund_id):
            for column in columns:
                if row[column] is not None:
                    assert row.get("serialization", NAME) in JSON_FORMATS, (table, column, row[column][:40])
                    json.loads(row[column])  # readable by anything that reads JSON, no base64 pickle
                    seen[table] = seen.get(table, 0) + 1
    assert (
        seen.get("workflow_input", 0) >= 4
        and seen.get("workflow_output", 0) >= 2
        and seen.get("operation_outputs", 0) >= 8
        and seen.get("notifications")
    )
    outputs = {r["function_name"]: r["output"] for r in system_rows(env, "operation_outputs", refund_id)}
    case = json.loads(outputs["orders.review_case"])  # the case file as its record's fields, typed by name
    assert case["$t"] == "model" and case["type"] == "steps.records:CaseFile"
    assert case["value"]["snapshot"]["order"]["order_id"] == "ord_1002"


def test_a_pickle_planted_in_the_system_database_is_refused_and_never_run(env: Env, tmp_path: Path) -> None:
    marker = tmp_path / "planted-pickle-ran"
    with running(env) as client:
        refund_id = submit(client, "json-checkpoints-2", "ord_1001", "The mouse stopped working.")
        assert wait_for_outcome(client, refund_id)["status"] == "completed"
        steps = client.list_workflow_steps(refund_id)
        first, last = steps[0]["function_id"], steps[-1]["function_id"]
        # Labelled as DBOS's own pickle (which DBOS would unpickle itself) and as this project's format.
        sql = "UPDATE {dbos}operation_outputs SET output = :out, serialization = :s WHERE workflow_uuid = :w"
        execute(env, sql + " AND function_id = :f", out=planted(marker), s=PICKLE, w=refund_id, f=first)
        execute(
            env,
            "UPDATE {dbos}workflow_output SET output = :out WHERE workflow_uuid = :w",
            out=planted(marker),
            w=refund_id,
        )
        execute(
            env, "UPDATE {dbos}workflow_status SET serialization = :s WHERE workflow_uuid = :w", s=PICKLE, w=refund_id
        )

        shown = {s["function_id"]: s["output"] for s in client.list_workflow_steps(refund_id)}
        assert shown[first] == planted(marker)  # shown as the text it is, not run
        with pytest.raises(CheckpointError):
            client.retrieve_workflow(refund_id).get_result()
        forked = client.fork_workflow(refund_id, last)  # replays the planted step from its checkpoint
        wait_for(
            lambda: client.retrieve_workflow(forked.workflow_id).get_status().status == "ERROR",
            timeout=60,
            what="the fork",
        )
        assert "refused to unpickle" in str(client.retrieve_workflow(forked.workflow_id).get_status().error)
    assert not marker.exists()


def test_a_pickle_planted_while_stopped_is_relabelled_by_the_next_start_and_never_run(env: Env, tmp_path: Path) -> None:
    marker = tmp_path / "planted-pickle-ran"
    with running(env) as client:
        refund_id = submit(client, "json-checkpoints-3", "ord_1001", "The mouse stopped working.")
        assert wait_for_outcome(client, refund_id)["status"] == "completed"
    as_the_pickling_release_left_it(env)  # as if written before this release, or by someone who removed the guard
    sql = "UPDATE {dbos}operation_outputs SET output = :out, serialization = :s WHERE workflow_uuid = :w"
    execute(env, sql, out=planted(marker), s=PICKLE, w=refund_id)

    engine = create_engine(env.dbs.system_url)
    try:
        converted = secure_checkpoints(engine)
    finally:
        engine.dispose()
    assert converted.refused >= 1
    assert {r["serialization"] for r in system_rows(env, "operation_outputs", refund_id)} == {NAME}
    with running(env) as client:
        shown = client.list_workflow_steps(refund_id)[0]["output"]
        assert shown == planted(marker)  # shown as the text it is: DBOS never unpickled it
    assert not marker.exists()


def test_records_pickled_by_the_previous_release_read_back_as_the_same_records() -> None:
    order = Order(
        order_id="ord_9",
        customer_id="c_9",
        customer_name="Ann",
        currency="EUR",
        amount_captured=Decimal("12.50"),
        amount_refunded=Decimal("0"),
        status="paid",
        paid_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        charge_id="ch_9",
        items=["mug"],
    )
    values: list[Any] = [
        OrderSnapshot(order=order, as_of=datetime(2026, 2, 1, tzinfo=UTC)),
        {"args": ("refund-9", {"order_id": "ord_9"}), "kwargs": {}},
        (Decimal("1.10"), None, {"a", "b"}),
        PaymentRefused("card expired"),
    ]
    for value in values:
        old = base64.b64encode(pickle.dumps(value)).decode()  # what DBOS's default serializer wrote
        back = SERIALIZER.deserialize(old)
        assert type(back) is type(value)
        assert (back.args == value.args) if isinstance(value, Exception) else back == value
        again = SERIALIZER.deserialize(SERIALIZER.serialize(value))  # and as JSON from here on
        assert (again.args == value.args) if isinstance(value, Exception) else again == value


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(eval),
        b"\x80\x04\x8c\x13agent.ops.processes\x8c\x10subprocess.Popen\x93.",
        pickle.dumps(SystemExit(3)),
        pickle.dumps(PaymentPlan),  # a trusted module's class is fine ...
    ],
    ids=["builtin eval", "dotted name through a trusted module", "an exit", "a trusted record class"],
)
def test_the_old_format_reader_builds_only_trusted_types(payload: bytes) -> None:
    text = base64.b64encode(payload).decode()
    if b"PaymentPlan" in payload:
        assert legacy_loads(text) is PaymentPlan
    else:
        with pytest.raises(CheckpointError):
            legacy_loads(text)


def test_a_value_of_an_unknown_type_is_an_error_when_checkpointed_not_a_pickle() -> None:
    with pytest.raises(TypeError, match="cannot checkpoint"):
        SERIALIZER.serialize({"when": object()})


def test_a_record_whose_loose_field_holds_a_decimal_reads_back_exactly() -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    entry = AuditEntry(
        seq=1, refund_id="r-1", event="e", payload={"amount": Decimal("1.50")}, created_at=at, prev_hash="", hash="h"
    )
    back = SERIALIZER.deserialize(SERIALIZER.serialize(entry))
    assert back == entry and type(back.payload["amount"]) is Decimal  # not the string "1.50"
    plain = entry.model_copy(update={"payload": {"n": 1}})
    assert json.loads(SERIALIZER.serialize(plain))["value"]["payload"] == {"n": 1}  # readable when nothing is lost


def test_an_error_checkpoint_naming_an_untrusted_class_or_an_exit_reads_as_a_plain_recorded_error() -> None:
    for name in ("builtins:SystemExit", "os:error", "subprocess:CalledProcessError"):
        stored = json.dumps({"$t": "error", "type": name, "message": "boom", "args": [3], "attrs": {}})
        back = SERIALIZER.deserialize(stored)
        assert type(back) is RecordedError and str(back) == f"{name}: boom"
    stored = json.dumps(
        {"$t": "error", "type": "steps.payments:PaymentRefused", "message": "no", "args": ["no"], "attrs": {}}
    )
    assert type(SERIALIZER.deserialize(stored)) is PaymentRefused  # the project's own errors come back as themselves


#: Records the steps return, as checkpoints already stored name them (module:class, and a minimal value).
STORED_RECORDS = {
    "steps.refunds:PaymentPlan": {"snapshot": None, "first_attempt_at": "2026-11-01T00:00:00Z", "refusal": "gone"},
    "steps.refunds:RegisteredRequest": {"refund_id": "r", "request_hash": "h", "created": True},
    "steps.evidence:Tracking": {"carrier": "usps", "tracking_code": "9400", "found": False},
    "steps.evidence:ReturnReceipt": {"order_id": "ord_1001", "status": "none"},
    "steps.evidence:RiskSignals": {"charge_id": "ch_1"},
    "steps.evidence:TicketHistory": {"email": "a@example.com"},
}


@pytest.mark.parametrize("name", sorted(STORED_RECORDS))
def test_a_record_stored_in_a_checkpoint_reads_back_from_the_module_it_names(name: str) -> None:
    """A checkpoint names a record's module: splitting a module must leave its records where they were stored."""
    stored = json.dumps({"$t": "model", "type": name, "value": STORED_RECORDS[name]})
    back = SERIALIZER.deserialize(stored)
    assert f"{type(back).__module__}:{type(back).__qualname__}" == name


#: DBOSClients built without this project's serializer on purpose: file -> why.
PICKLING_CLIENTS = {"tests/test_upgrade.py": "the release before JSON checkpoints, as its callers were"}


def test_every_dbos_client_in_the_repository_reads_and_writes_json_checkpoints() -> None:
    root = Path(__file__).resolve().parents[1]
    missing = []
    for folder in ("agent", "steps", "sandbox", "proving", "benchmarks", "tests"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", "")) == "DBOSClient"
                ):
                    where = str(path.relative_to(root))
                    if "serializer" not in {k.arg for k in node.keywords} and where not in PICKLING_CLIENTS:
                        missing.append(f"{where}:{node.lineno}")
    assert missing == [], f"DBOSClient without serializer=SERIALIZER (agent/ops/checkpoints.py): {missing}"
