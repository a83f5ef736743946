"""The refund flows compared: the product's DBOS workflow, the same logic without durability, the floor.

- ``dbos_refund``: the product's ``refund_workflow``, started in this process with the refund id as
  workflow id (as the queue worker does after ``POST /refunds``), awaited to its result.
- ``dbos_approved_refund``: the same for a refund that needs approval: it parks and ends; the API's
  decision path approves it (the decision workflow in this process); the continuation it enqueues on
  the ``approvals`` queue is taken by this process's worker and pays.
- ``plain_refund``: the same agent (same offline model, instructions, tools and output type, without the
  ``DBOSDurability`` capability) and the same step functions called outside any workflow: every
  application read and write, the payment call and its idempotency key are the same; nothing is
  checkpointed (DBOS runs a datasource transaction outside a workflow as a plain transaction and a
  step as a plain call).
- ``Floor``: one INSERT + COMMIT per checkpoint on a connection to the same kind of database, as many
  as the DBOS workflow writes per refund (counted from its system tables).
"""

from __future__ import annotations

import asyncio
import sqlite3
from decimal import Decimal
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.models import Model

from agent import approvals, policy
from agent.approval_workflows import decide_here
from agent.brain import AGENT_NAME, INSTRUCTIONS, AgentDeps, prompt_for
from agent.domain import ApprovalRecord, RefundProposal, RefundRequest
from agent.offline import offline_model
from agent.ops.offloop import call
from agent.runtime import Runtime
from agent.workflow import policy_verdict, refund_workflow
from benchmarks.identities import BENCH_APPROVER
from steps.approval_book import record_decision_step
from steps.notify import CustomerMessage
from steps.orders import review_case_step
from steps.payments import issue_refund_step
from steps.reservations import record_payment_step, record_verdict_and_reserve_step
from steps.store import session, transaction

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


class StatusPolls:
    """Reads of a workflow's status made while waiting for it (the commit count leaves them out)."""

    count = 0


async def dbos_approved_refund(refund_id: str, request: RefundRequest) -> dict[str, Any]:
    """Start; it parks and ends. Approve it as the API does; wait for its continuation to pay."""
    with SetWorkflowID(refund_id):
        handle = await DBOS.start_workflow_async(refund_workflow, refund_id, request.model_dump(mode="json"))
    parked: dict[str, Any] = await handle.get_result()
    if parked.get("status") != "awaiting_approval":
        raise RuntimeError(f"refund {refund_id} did not park for approval: {parked.get('status')}")
    from benchmarks.harness import off_loop  # DBOS's synchronous API runs off the event loop

    def approve_here() -> None:
        approvals.decide_pending(
            decide_here, refund_id=refund_id, decision="approve", approver=BENCH_APPROVER, via="console"
        )

    await off_loop(approve_here)
    return await _ended(approvals.settle_id(refund_id))


async def _ended(workflow_id: str, interval: float = 0.01, timeout: float = 60.0) -> dict[str, Any]:
    """The result of a workflow this process's queue worker runs; a handle would poll once a second."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        StatusPolls.count += 1
        found = await DBOS.get_workflow_status_async(workflow_id)
        if found is not None and found.status == "SUCCESS":
            result: dict[str, Any] = await (await DBOS.retrieve_workflow_async(workflow_id)).get_result()
            return result
        if found is not None and found.status in ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
            return {"status": found.status}
        await asyncio.sleep(interval)
    return {"status": "timed out"}


def approve(refund_id: str, amount: Decimal, currency: str) -> ApprovalRecord:
    """Record an approval as the decision workflow does (first writer wins), outside any workflow."""
    from datetime import UTC, datetime

    return record_decision_step(
        ApprovalRecord(
            refund_id=refund_id,
            decision="approve",
            approver="bench",
            amount=amount,
            currency=currency,
            decided_at=datetime.now(UTC),
        )
    )


# ------------------------------------------------------------------------------------- no durability

_plain_agents: dict[int, Agent[AgentDeps, RefundProposal]] = {}


def plain_agent(model: Model | None = None) -> Agent[AgentDeps, RefundProposal]:
    """The product's agent without the DBOS capability: the same model (default: offline), instructions, output."""
    key = id(model)
    if key not in _plain_agents:
        _plain_agents[key] = Agent(
            model or offline_model(),
            name=f"{AGENT_NAME}_plain",
            deps_type=AgentDeps,
            output_type=RefundProposal,
            instructions=INSTRUCTIONS,
        )
    return _plain_agents[key]


async def plain_refund(
    refund_id: str, request: RefundRequest, rt: Runtime, model: Model | None = None
) -> dict[str, Any]:
    """``refund_workflow``'s auto-approve path, line by line, outside any workflow."""
    case = review_case_step(request.order_id)
    deps = AgentDeps(refund_id, request, rt.limits, snapshot=case.snapshot)
    run = await plain_agent(model).run(prompt_for(refund_id, request, case, rt.limits), deps=deps)
    proposal = run.output
    snapshot = case.snapshot
    verdict = policy_verdict(proposal, snapshot, rt.limits, requested=request.amount)
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
        open_claims_allowed=rt.limits.order_max_open_claims,
    )
    assert plan.snapshot is not None
    order = plan.snapshot.order
    recheck = policy.recheck(
        amount=verdict.amount,
        currency=verdict.currency,
        order=order,
        as_of=plan.snapshot.as_of,
        limits=rt.limits,
        requested=plan.requested,
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
    usage = run.usage
    return {
        "refund_id": refund_id,
        "status": "completed",
        "provider_refund_id": payment.provider_refund_id,
        "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    }


# ------------------------------------------------------------------------------------------- checkpoints


def dbos_checkpoints(system_url: str, refund_ids: list[str]) -> dict[str, float]:
    """Rows DBOS wrote per refund in its system tables, over all of a refund's workflows (the deciding
    one, and on the approval path its decision, continuation and timers): step outputs
    (operation_outputs) and statuses (workflow_status)."""
    from steps.store import create_engine

    workflow_ids = [w for refund_id in refund_ids for w in approvals.family(refund_id)]

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
                counts[table] = counted / len(refund_ids)
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


# ------------------------------------------------------------------------------ the shape, doing nothing
# The auto path's five steps in its order and kinds (a read step, the model's async step, a datasource
# transaction, the payment step, a datasource transaction), each doing nothing: what DBOS's protocol
# alone costs a refund of this shape. ``noop_plain`` calls the same functions outside any workflow.


@DBOS.step(name="bench.noop_step")
def _noop_step() -> None:
    return None


@DBOS.step(name="bench.noop_async_step")
async def _noop_async_step() -> None:
    return None


@transaction("bench.noop_transaction")
def _noop_transaction() -> None:
    session().execute(sa.text("SELECT 1"))


async def _noop_shape() -> dict[str, Any]:
    await call(_noop_step)
    await _noop_async_step()
    await call(_noop_transaction)
    await call(_noop_step)
    await call(_noop_transaction)
    return {"status": "completed"}


@DBOS.workflow(name="bench_noop_shape")
async def noop_shape_workflow() -> dict[str, Any]:
    return await _noop_shape()


async def dbos_noop(refund_id: str) -> dict[str, Any]:
    with SetWorkflowID(refund_id):
        handle = await DBOS.start_workflow_async(noop_shape_workflow)
    result: dict[str, Any] = await handle.get_result()
    return result


async def noop_plain() -> dict[str, Any]:
    return await _noop_shape()
