"""The refund flows compared: the product's DBOS workflow, the same logic without durability, the floor.

- ``dbos_refund``: the product's ``refund_workflow``, started in this process with the refund id as
  workflow id (as the queue worker does after ``POST /refunds``), awaited to its result.
- ``plain_refund``: the same agent (same offline model, instructions, tools and output type, without the
  ``DBOSDurability`` capability) and the same step functions called outside any workflow: every
  application read and write, the payment call and its idempotency key are the same; nothing is
  checkpointed (DBOS runs a datasource transaction outside a workflow as a plain transaction and a
  step as a plain call).
- ``Floor``: one INSERT + COMMIT per checkpoint on a connection to the same kind of database, as many
  as the DBOS workflow writes per refund (counted from its system tables).
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent

from agent import policy
from agent.approvals import APPROVAL_EVENT, APPROVAL_TOPIC
from agent.brain import AGENT_NAME, INSTRUCTIONS, AgentDeps, get_order, get_refund_history, prompt_for, request_refund
from agent.domain import ApprovalRecord, RefundProposal, RefundRequest
from agent.offline import offline_model
from agent.runtime import Runtime
from agent.workflow import policy_verdict, refund_workflow
from steps.notify import CustomerMessage
from steps.orders import load_order_step
from steps.payments import issue_refund_step
from steps.refunds import record_decision, record_payment_step, record_verdict_and_reserve_step

# ------------------------------------------------------------------------------------------------ DBOS


async def dbos_refund(refund_id: str, request: RefundRequest) -> dict[str, Any]:
    with SetWorkflowID(refund_id):
        handle = await DBOS.start_workflow_async(refund_workflow, refund_id, request.model_dump(mode="json"))
    result: dict[str, Any] = await handle.get_result()
    return result


def dbos_refund_sync(refund_id: str, request: RefundRequest) -> dict[str, Any]:
    """The same workflow started and awaited through DBOS's synchronous API, from a thread."""
    with SetWorkflowID(refund_id):
        handle = DBOS.start_workflow(refund_workflow, refund_id, request.model_dump(mode="json"))
    # A coroutine workflow started through the sync API runs on DBOS's own event loop; get_result
    # blocks for its value (the stubs type it as the coroutine).
    result: dict[str, Any] = handle.get_result()  # type: ignore[assignment]
    return result


async def dbos_approved_refund(refund_id: str, request: RefundRequest) -> dict[str, Any]:
    """Start, wait until it waits for a person, approve it (record + send, as the API does), finish."""
    with SetWorkflowID(refund_id):
        handle = await DBOS.start_workflow_async(refund_workflow, refund_id, request.model_dump(mode="json"))
    pending = await DBOS.get_event_async(refund_id, APPROVAL_EVENT, timeout_seconds=60)
    if pending is None:
        raise RuntimeError(f"refund {refund_id} never asked for approval")
    approve(refund_id, Decimal(pending["amount"]), pending["currency"])
    await DBOS.send_async(refund_id, {"decision": "approve"}, APPROVAL_TOPIC, idempotency_key=f"approval:{refund_id}")
    result: dict[str, Any] = await handle.get_result()
    return result


def approve(refund_id: str, amount: Decimal, currency: str) -> ApprovalRecord:
    from datetime import UTC, datetime

    record, _ = record_decision(
        ApprovalRecord(
            refund_id=refund_id,
            decision="approve",
            approver="bench",
            amount=amount,
            currency=currency,
            decided_at=datetime.now(UTC),
        )
    )
    return record


# ------------------------------------------------------------------------------------- no durability

_plain_agent: Agent[AgentDeps, RefundProposal] | None = None


def plain_agent() -> Agent[AgentDeps, RefundProposal]:
    """The product's agent without the DBOS capability: the same model, instructions, tools, output."""
    global _plain_agent
    if _plain_agent is None:
        _plain_agent = Agent(
            offline_model(),
            name=f"{AGENT_NAME}_plain",
            deps_type=AgentDeps,
            output_type=RefundProposal,
            instructions=INSTRUCTIONS,
            tools=[get_order, get_refund_history, request_refund],
        )
    return _plain_agent


async def plain_refund(refund_id: str, request: RefundRequest, rt: Runtime) -> dict[str, Any]:
    """``refund_workflow``'s auto-approve path, line by line, outside any workflow."""
    deps = AgentDeps(refund_id, request, rt.limits)
    run = await plain_agent().run(prompt_for(request), deps=deps)
    proposal = run.output
    snapshot = deps.snapshot if deps.snapshot is not None else load_order_step(request.order_id)
    verdict = policy_verdict(proposal, snapshot, rt.limits)
    if verdict.kind != "auto_approve":
        raise RuntimeError(f"benchmark refund {refund_id} was not auto-approved: {verdict.kind}")
    plan = record_verdict_and_reserve_step(
        refund_id,
        request.order_id,
        proposal=proposal.model_dump(mode="json"),
        verdict=verdict.model_dump(mode="json"),
        model=rt.model_label,
        amount=verdict.amount,
        currency=verdict.currency,
    )
    assert plan.snapshot is not None
    order = plan.snapshot.order
    recheck = policy.decide(
        amount=verdict.amount, currency=verdict.currency, order=order, as_of=plan.snapshot.as_of, limits=rt.limits
    )
    assert recheck.kind != "refuse"
    payment = issue_refund_step(
        refund_id=refund_id,
        order_id=order.order_id,
        charge_id=order.charge_id,
        amount=verdict.amount,
        currency=verdict.currency,
        first_attempt_at=plan.first_attempt_at,
    )
    message = CustomerMessage(customer_id=order.customer_id, text=proposal.customer_reply)
    record_payment_step(refund_id, order.order_id, payment, notify=message)
    return {"refund_id": refund_id, "status": "completed", "provider_refund_id": payment.provider_refund_id}


# ------------------------------------------------------------------------------------------- checkpoints


def dbos_checkpoints(system_url: str, workflow_ids: list[str]) -> dict[str, float]:
    """Rows DBOS wrote per workflow in its system tables: step outputs (operation_outputs) and status."""
    from steps.store import create_engine

    engine = create_engine(system_url)
    schema = "" if system_url.startswith("sqlite") else "dbos."  # a constant, never input
    counts: dict[str, float] = {}
    try:
        with engine.connect() as conn:
            for table in ("operation_outputs", "workflow_status"):
                query = sa.text(f"SELECT count(*) FROM {schema}{table} WHERE workflow_uuid IN :ids")  # noqa: S608
                counted = conn.execute(
                    query.bindparams(sa.bindparam("ids", expanding=True)), {"ids": workflow_ids}
                ).scalar_one()
                counts[table] = counted / len(workflow_ids)
    finally:
        engine.dispose()
    return counts


# ------------------------------------------------------------------------------------------------ floor

_FLOOR_ROW = "x" * 200  # about the size of a small step output


class Floor:
    """One INSERT + COMMIT per checkpoint: the least a checkpoint can cost on this database."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        if backend == "sqlite":
            path = url.removeprefix("sqlite:///")
            self.sqlite = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            # The settings the product gives DBOS's SQLite system database.
            harness_commits().attach(self.sqlite)
            self.sqlite.execute("PRAGMA journal_mode=WAL")
            self.sqlite.execute("PRAGMA synchronous=NORMAL")
            self.sqlite.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, k TEXT, v TEXT)")
        else:
            self.pg = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
            self.pg.execute("CREATE TABLE IF NOT EXISTS floor (id bigserial PRIMARY KEY, k text, v text)")
            self.pg.commit()

    def checkpoints(self, key: str, n: int) -> None:
        for i in range(n):
            if self.backend == "sqlite":
                self.sqlite.execute("BEGIN")
                self.sqlite.execute("INSERT INTO floor (k, v) VALUES (?, ?)", (f"{key}:{i}", _FLOOR_ROW))
                self.sqlite.execute("COMMIT")
            else:
                self.pg.execute("INSERT INTO floor (k, v) VALUES (%s, %s)", (f"{key}:{i}", _FLOOR_ROW))
                self.pg.commit()

    def close(self) -> None:
        if self.backend == "sqlite":
            self.sqlite.close()
        else:
            self.pg.close()


def harness_commits() -> Any:
    from benchmarks.harness import sqlite_commits

    return sqlite_commits
