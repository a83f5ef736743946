"""The same refund flow as a LangGraph graph, checkpointed by PostgresSaver / SqliteSaver.

One node per external call of the refund's workflows, so LangGraph checkpoints after each step as
DBOS does:

    review_case (the order and the customer's refunds, one read) -> model (one request: the proposal)
      -> record_verdict (policy on the case file's order; auto-approved: + reservation;
                         needs approval: + the approval request, ``open_approval``)
      -> [notify_approvers -> await_approval (interrupt) -> prepare_payment (the approved amount)]
      -> pay -> record_payment (with the customer's message)

The approval is recorded outside the graph as the product's decision workflow records it, then the
graph resumes (``Command(resume=...)``) where DBOS's continuation would start.

The model node asks the same model the product's agent does (by default the offline model function;
``Context.request`` swaps in any Pydantic AI model, e.g. one served over HTTP) with the same prompt,
instructions and output tool; every application write, the payment call and its idempotency key are
the ones the DBOS workflow makes (the product's step functions, called outside a workflow). Without a
checkpointer the same graph is the LangGraph flow's no-durability twin.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Literal, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from pydantic_ai.direct import model_request_sync
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import ToolDefinition

from agent import policy
from agent.brain import INSTRUCTIONS, prompt_for
from agent.domain import RefundProposal, RefundRequest, Verdict
from agent.offline import offline_model_function
from steps.approval_book import open_approval_step
from steps.notify import CustomerMessage, notify_approvers_step
from steps.orders import review_case_step
from steps.payments import issue_refund_step
from steps.records import OrderSnapshot, ProviderRefund
from steps.refunds import PaymentPlan, record_verdict_step
from steps.reservations import prepare_approved_payment_step, record_payment_step, record_verdict_and_reserve_step

OUTPUT_TOOL = "final_result"
_OUTPUT = ToolDefinition(name=OUTPUT_TOOL, parameters_json_schema=RefundProposal.model_json_schema(), kind="output")
_INFO = AgentInfo(
    function_tools=[],
    allow_text_output=False,
    output_tools=[_OUTPUT],
    model_settings=None,
    model_request_parameters=ModelRequestParameters(),
    instructions=INSTRUCTIONS,
)
#: What the model is asked with: no function tools, the proposal as the output tool (as the agent asks).
REQUEST_PARAMETERS = ModelRequestParameters(output_mode="tool", output_tools=[_OUTPUT], allow_text_output=False)


class RefundState(TypedDict, total=False):
    refund_id: str
    request: dict[str, Any]
    messages: list[Any]
    snapshot: dict[str, Any] | None
    proposal: dict[str, Any]
    usage: dict[str, int]
    verdict: dict[str, Any]
    plan: dict[str, Any]
    decision: dict[str, Any]
    payment: dict[str, Any]
    outcome: dict[str, Any]


def offline_request(messages: list[ModelMessage]) -> ModelResponse:
    return offline_model_function(messages, _INFO)


def model_requester(model: Model) -> Callable[[list[ModelMessage]], ModelResponse]:
    """Ask ``model`` (any Pydantic AI model) for the proposal, synchronously, as the graph's node runs."""

    def request(messages: list[ModelMessage]) -> ModelResponse:
        return model_request_sync(model, messages, model_request_parameters=REQUEST_PARAMETERS)

    return request


class Context:
    """What the nodes need besides the state: the policy limits, the model label and how to ask the model."""

    limits: policy.Limits
    model_label: str = "offline model"
    request: Callable[[list[ModelMessage]], ModelResponse] = staticmethod(offline_request)


ctx = Context()


def _messages(state: RefundState) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_python(state["messages"])


def _dump(messages: list[ModelMessage]) -> list[Any]:
    return list(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))


def review_case_node(state: RefundState) -> RefundState:
    """The case file, read once, as the workflow's ``orders.review_case`` step reads it; the model's prompt."""
    request = RefundRequest.model_validate(state["request"])
    case = review_case_step(request.order_id)
    prompt = prompt_for(state["refund_id"], request, case, ctx.limits)
    first = ModelRequest(parts=[UserPromptPart(prompt)], instructions=INSTRUCTIONS)
    snapshot = case.snapshot.model_dump(mode="json") if case.snapshot else None
    return {"snapshot": snapshot, "messages": _dump([first])}


def model_node(state: RefundState) -> RefundState:
    messages = _messages(state)
    response = ctx.request(messages)
    call = response.parts[0]
    if not (isinstance(call, ToolCallPart) and call.tool_name == OUTPUT_TOOL):
        raise RuntimeError(f"LangGraph refund {state['refund_id']}: the model did not answer with a proposal")
    usage = {"requests": 1, "input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens}
    return {
        "messages": _dump([*messages, response]),
        "proposal": RefundProposal.model_validate(call.args_as_dict()).model_dump(mode="json"),
        "usage": usage,
    }


def record_verdict_node(state: RefundState) -> RefundState:
    """Policy on the order the case file read (as the workflow judges it), then the record."""
    request = RefundRequest.model_validate(state["request"])
    proposal = RefundProposal.model_validate(state["proposal"])
    assert state.get("snapshot") is not None
    snapshot = OrderSnapshot.model_validate(state["snapshot"])
    verdict = policy.decide(
        amount=proposal.amount,
        currency=proposal.currency,
        order=snapshot.order,
        as_of=snapshot.as_of,
        limits=ctx.limits,
    )
    record: dict[str, Any] = {
        "proposal": state["proposal"],
        "verdict": verdict.model_dump(mode="json"),
        "model": ctx.model_label,
    }
    if verdict.kind == "needs_approval":  # as the workflow parks: the verdict and the request together
        open_approval_step(
            state["refund_id"],
            **record,
            amount=verdict.amount,
            currency=verdict.currency,
            reason=proposal.reason,
            escalate_after=4 * 3600,
            timeout=72 * 3600,
        )
        return {"verdict": record["verdict"]}
    if verdict.kind != "auto_approve":
        record_verdict_step(state["refund_id"], **record)
        return {"verdict": record["verdict"]}
    # As the workflow does: an auto-approved refund's verdict and reservation commit together.
    plan = record_verdict_and_reserve_step(
        state["refund_id"],
        request.order_id,
        **record,
        amount=verdict.amount,
        currency=verdict.currency,
        open_claims_allowed=ctx.limits.order_max_open_claims,
    )
    _recheck(state["refund_id"], verdict, plan)
    return {"verdict": record["verdict"], "plan": plan.model_dump(mode="json")}


def after_verdict(state: RefundState) -> str:
    kind = state["verdict"]["kind"]
    if kind == "refuse":
        raise RuntimeError(f"benchmark refund {state['refund_id']} was refused")
    return "notify_approvers" if kind == "needs_approval" else "pay"


def notify_approvers_node(state: RefundState) -> RefundState:
    verdict = state["verdict"]
    text = f"Refund {state['refund_id']} of {verdict['amount']} {verdict['currency']} needs approval"
    notify_approvers_step(state["refund_id"], kind="request", messages={"bench-approver": text})
    return {}


def await_approval_node(state: RefundState) -> RefundState:
    verdict = state["verdict"]
    decision = interrupt(
        {"refund_id": state["refund_id"], "amount": verdict["amount"], "currency": verdict["currency"]}
    )
    return {"decision": dict(decision)}


def prepare_payment_node(state: RefundState) -> RefundState:
    """As the continuation does: reserve the approved amount, which must be the one requested."""
    if state["decision"].get("decision") != "approve":
        raise RuntimeError(f"benchmark refund {state['refund_id']} was not approved: {state['decision']}")
    verdict = Verdict.model_validate(state["verdict"])
    plan = prepare_approved_payment_step(state["refund_id"], amount=verdict.amount, currency=verdict.currency)
    _recheck(state["refund_id"], verdict, plan)
    return {"plan": plan.model_dump(mode="json")}


def _recheck(refund_id: str, verdict: Verdict, plan: PaymentPlan) -> None:
    assert plan.snapshot is not None
    recheck = policy.decide(
        amount=verdict.amount,
        currency=verdict.currency,
        order=plan.snapshot.order,
        as_of=plan.snapshot.as_of,
        limits=ctx.limits,
    )
    if recheck.kind == "refuse":
        raise RuntimeError(f"benchmark refund {refund_id} refused on re-check")


def pay_node(state: RefundState) -> RefundState:
    plan = PaymentPlan.model_validate(state["plan"])
    verdict = Verdict.model_validate(state["verdict"])
    assert plan.snapshot is not None
    order = plan.snapshot.order
    payment = issue_refund_step(
        refund_id=state["refund_id"],
        order_id=order.order_id,
        charge_id=order.charge_id,
        amount=verdict.amount,
        currency=verdict.currency,
        first_attempt_at=plan.first_attempt_at,
    )
    return {"payment": payment.model_dump(mode="json")}


def record_payment_node(state: RefundState) -> RefundState:
    """The book and the customer's message in one transaction, as the workflow records them."""
    request = RefundRequest.model_validate(state["request"])
    plan = PaymentPlan.model_validate(state["plan"])
    assert plan.snapshot is not None
    message = CustomerMessage(customer_id=plan.snapshot.order.customer_id, text=state["proposal"]["customer_reply"])
    payment = state["payment"]
    record_payment_step(state["refund_id"], request.order_id, ProviderRefund.model_validate(payment), notify=message)
    return {"outcome": {"status": "completed", "provider_refund_id": payment["provider_refund_id"]}}


def build_graph(checkpointer: BaseCheckpointSaver[Any] | None) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(RefundState)
    nodes = {
        "review_case": review_case_node,
        "model": model_node,
        "record_verdict": record_verdict_node,
        "notify_approvers": notify_approvers_node,
        "await_approval": await_approval_node,
        "prepare_payment": prepare_payment_node,
        "pay": pay_node,
        "record_payment": record_payment_node,
    }
    for name, fn in nodes.items():
        g.add_node(name, fn)
    g.add_edge(START, "review_case")
    g.add_edge("review_case", "model")
    g.add_edge("model", "record_verdict")
    g.add_conditional_edges("record_verdict", after_verdict, ["notify_approvers", "pay"])
    g.add_edge("notify_approvers", "await_approval")
    g.add_edge("await_approval", "prepare_payment")
    g.add_edge("prepare_payment", "pay")
    g.add_edge("pay", "record_payment")
    g.add_edge("record_payment", END)
    return g.compile(checkpointer=checkpointer)


def initial_state(refund_id: str, request: RefundRequest) -> RefundState:
    return {"refund_id": refund_id, "request": request.model_dump(mode="json"), "messages": []}


def run_refund(graph: CompiledStateGraph[Any, Any, Any, Any], refund_id: str, request: RefundRequest) -> dict[str, Any]:
    config: Any = {"configurable": {"thread_id": refund_id}}
    # Without a checkpointer, durability="sync" fails inside langgraph 1.2.22 (an attribute only a
    # checkpointed loop sets); it means nothing there anyway.
    durability: Literal["sync"] | None = "sync" if graph.checkpointer else None
    state = graph.invoke(initial_state(refund_id, request), config, durability=durability)
    if "outcome" not in state:
        raise RuntimeError(f"LangGraph refund {refund_id} did not complete: {sorted(state)}")
    return {**state["outcome"], "usage": state.get("usage")}


def run_approved_refund(
    graph: CompiledStateGraph[Any, Any, Any, Any], refund_id: str, request: RefundRequest
) -> dict[str, Any]:
    """Run to the approval interrupt, record the approval as the product does, resume to the end."""
    from benchmarks.flows import approve

    config: Any = {"configurable": {"thread_id": refund_id}}
    state = graph.invoke(initial_state(refund_id, request), config, durability="sync")
    interrupts = state.get("__interrupt__")
    if not interrupts:
        raise RuntimeError(f"LangGraph refund {refund_id} did not stop for approval")
    pending = interrupts[0].value
    record = approve(refund_id, Decimal(pending["amount"]), pending["currency"])
    state = graph.invoke(Command(resume=record.model_dump(mode="json")), config, durability="sync")
    if "outcome" not in state:
        raise RuntimeError(f"LangGraph refund {refund_id} did not complete after approval")
    return dict(state["outcome"])


@contextmanager
def saver(backend: str, url: str, *, pool_size: int = 20) -> Iterator[BaseCheckpointSaver[Any]]:
    """PostgresSaver on a connection pool (as LangGraph documents for concurrent use) or SqliteSaver
    on one connection, WAL with synchronous=NORMAL (the settings the product gives DBOS's SQLite)."""
    if backend == "sqlite":
        from benchmarks.harness import sqlite_commits

        conn = sqlite3.connect(url, check_same_thread=False)
        sqlite_commits.attach(conn)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        sqlite_saver = SqliteSaver(conn)
        sqlite_saver.setup()
        try:
            yield sqlite_saver
        finally:
            conn.close()
        return
    pool = ConnectionPool(
        url.replace("postgresql+psycopg://", "postgresql://"),
        min_size=1,
        max_size=pool_size,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    try:
        pg_saver = PostgresSaver(pool)  # type: ignore[arg-type]
        pg_saver.setup()
        yield pg_saver
    finally:
        pool.close()


def checkpoints_per_refund(backend: str, url: str, thread_ids: list[str]) -> dict[str, float]:
    """Rows LangGraph wrote per refund: checkpoints and pending writes."""
    n = len(thread_ids)
    if backend == "sqlite":
        with sqlite3.connect(url) as conn:
            marks = ",".join("?" * n)
            cps = conn.execute(f"SELECT count(*) FROM checkpoints WHERE thread_id IN ({marks})", thread_ids).fetchone()  # noqa: S608
            writes = conn.execute(f"SELECT count(*) FROM writes WHERE thread_id IN ({marks})", thread_ids).fetchone()  # noqa: S608
        return {"checkpoints": cps[0] / n, "writes": writes[0] / n}
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as pg:
        c = pg.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%s)", (thread_ids,)).fetchone()
        w = pg.execute("SELECT count(*) FROM checkpoint_writes WHERE thread_id = ANY(%s)", (thread_ids,)).fetchone()
    assert c is not None and w is not None
    return {"checkpoints": c[0] / n, "writes": w[0] / n}
