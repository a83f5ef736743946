"""Run the agent on one case: a throwaway order store, the case-file read, the agent, policy's verdict. No payment."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_ai import Agent, capture_run_messages
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_evals import increment_eval_metric

from agent import policy
from agent.brain import AgentDeps, prompt_for
from agent.domain import RefundProposal, RefundRequest
from agent.ops.offloop import call
from agent.rejudge import judge_answer
from agent.submit import SubmissionError, checked_request
from agent.whole_case import case_claim, complete_case
from agent.workflow import policy_verdict
from proving.evals.cases import DatasetFile, EvalCase, OrderSpec
from steps.orders import get_order, review_case_step
from steps.outside_refunds import outside_refunds_step
from steps.records import CaseFile, to_minor
from steps.store import app_db, close_app_database, customers, metadata, open_app_database, orders, refunds

Stage = Literal["decided", "submission", "error"]
VerdictSeen = Literal["auto_approve", "needs_approval", "refuse", "ask_customer", "error"]


class ToolCall(BaseModel):
    tool: str
    args: dict[str, Any]
    result: Any = None


class Answered(BaseModel):
    """The refund judged again with the case's answer to its question (agent/rejudge.py ``judge_answer``)."""

    verdict: VerdictSeen
    amount: Decimal
    """What would be paid (0 unless the verdict pays)."""
    reasons: list[str] = []
    evidence: dict[str, Any] = {}


class CaseOutcome(BaseModel):
    """What happened on one case; ``amount`` is what would be paid (0 unless the verdict pays)."""

    order_id: str
    """The order the verdict was reached on (read by the run's own case-file read, not copied from the case)."""
    stage: Stage
    verdict: VerdictSeen
    amount: Decimal
    currency: str
    proposed_amount: Decimal | None = None
    proposed_currency: str | None = None
    reasons: list[str] = []
    reply: str | None = None
    approver_reason: str | None = None
    error: str | None = None
    category: str | None = None
    """The claim's category as the agent read it (its proposal's)."""
    evidence: dict[str, Any] = {}
    """What the look-up steps returned in the run (``AgentDeps.evidence``), the record policy judged."""
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: list[ToolCall] = []
    messages: list[Any] = []
    """The run's messages (ModelMessagesTypeAdapter JSON): the trace to read when a case fails."""
    question: str | None = None
    """With ``ask_customer``: what the customer was asked for."""
    answered: Answered | None = None
    """With ``ask_customer`` and a case that gives the answer: the second judgement."""

    @property
    def pays(self) -> bool:
        return self.verdict in ("auto_approve", "needs_approval")

    def settled(self) -> CaseOutcome:
        """What the refund ends up paying: this outcome, or, once the customer answered its question, the outcome
        judged again with the answer (the one the money rules are checked on)."""
        if self.answered is None:
            return self
        a = self.answered
        return self.model_copy(update={"verdict": a.verdict, "amount": a.amount, "evidence": a.evidence})

    @property
    def look_ups(self) -> list[str]:
        """The tools the model called other than its answer (the look-ups), in order, repeats included."""
        return [c.tool for c in self.tool_calls if not c.tool.startswith(OUTPUT_TOOL)]


#: Pydantic AI's name for the answer's tool (``final_result``, or ``final_result_<type>`` with several).
OUTPUT_TOOL = "final_result"


@contextmanager
def throwaway_store(data: DatasetFile, *, now: datetime | None = None) -> Iterator[str]:
    """A fresh SQLite application database holding every case's customers, orders and earlier refunds, opened for
    the case-file read.

    Opened without a DBOS datasource: the read steps run as plain reads and transactions, record no
    checkpoint, and DBOS is never launched.
    """
    now = now or datetime.now(UTC)
    tmp = Path(tempfile.mkdtemp(prefix="refund-eval-"))
    try:
        db = open_app_database(f"sqlite:///{tmp / 'app.sqlite'}")
        metadata.create_all(db.engine)
        specs = {o.id: o for c in data.cases for o in c.orders}
        with db.engine.begin() as conn:
            for customer, name in {o.customer: o.name for o in specs.values()}.items():
                conn.execute(
                    customers.insert().values(customer_id=customer, name=name, email=f"{customer}@example.com")
                )
            for spec in specs.values():
                conn.execute(orders.insert().values(**_order_row(spec, now)))
            for case in data.cases:
                for n, earlier in enumerate(case.earlier_refunds):
                    currency = specs[earlier.order].currency
                    at = now - timedelta(days=earlier.days)
                    minor = to_minor(earlier.amount, currency)
                    conn.execute(
                        refunds.insert().values(
                            refund_id=f"earlier-{case.name}-{n}", order_id=earlier.order, request_hash="0" * 64,
                            currency=currency, requested_amount_minor=minor, proposed_amount_minor=minor,
                            status=earlier.status, created_at=at, updated_at=at,
                        )
                    )  # fmt: skip
        yield db.url
    finally:
        close_app_database()
        shutil.rmtree(tmp, ignore_errors=True)


def _order_row(spec: OrderSpec, now: datetime) -> dict[str, Any]:
    order = spec.order(now)
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "currency": order.currency,
        "amount_captured_minor": to_minor(order.amount_captured, order.currency),
        "amount_refunded_minor": to_minor(order.amount_refunded, order.currency),
        "status": order.status,
        "paid_at": order.paid_at,
        "charge_id": order.charge_id,
        "items": order.items,
        "notes": order.notes,
        "carrier": order.carrier,
        "tracking_code": order.tracking_code,
    }


def submission_error(request: RefundRequest) -> tuple[str | None, RefundRequest]:
    """The checks ``POST /refunds`` makes before a request reaches the agent, on the case's stored order."""
    with app_db().engine.connect() as conn:
        order = get_order(conn, request.order_id)
    try:
        return None, checked_request(request, order)
    except SubmissionError as error:
        return str(error), request


def tool_calls(messages: list[ModelMessage]) -> list[ToolCall]:
    """Every tool call the model made, with what came back (the output tool's call is the proposal)."""
    calls: dict[str, ToolCall] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(message, ModelResponse) and isinstance(part, ToolCallPart):
                calls[part.tool_call_id] = ToolCall(tool=part.tool_name, args=part.args_as_dict())
            elif (
                isinstance(message, ModelRequest)
                and isinstance(part, ToolReturnPart | RetryPromptPart)
                and (call := calls.get(part.tool_call_id or "")) is not None
            ):
                call.result = part.content if isinstance(part, ToolReturnPart) else {"retry": part.model_response()}
    return list(calls.values())


def _usage_from_messages(messages: list[ModelMessage]) -> tuple[int, int, int]:
    responses = [m for m in messages if isinstance(m, ModelResponse)]
    return len(responses), sum(r.usage.input_tokens for r in responses), sum(r.usage.output_tokens for r in responses)


class CaseRunner:
    """Runs the one agent of an evaluation run on each case (the pydantic-evals task)."""

    def __init__(
        self,
        agent: Agent[AgentDeps, RefundProposal],
        limits: policy.Limits,
        *,
        read_case: Callable[[RefundRequest], CaseFile] | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits
        self.read_case = read_case or (lambda request: review_case_step(request.order_id))

    async def __call__(self, case: EvalCase) -> CaseOutcome:
        request = case.refund_request()
        order = case.order
        problem, request = submission_error(request)
        if problem is not None:
            return CaseOutcome(
                order_id=order.id, stage="submission", verdict="refuse", amount=Decimal(0), currency=order.currency,
                reasons=[f"rejected at submission: {problem}"],
            )  # fmt: skip
        refund_id = f"eval-{case.name}"
        case_file = self.read_case(request)  # the workflow's one read, as the workflow makes it
        deps = AgentDeps(refund_id=refund_id, request=request, limits=self.limits, snapshot=case_file.snapshot)
        with capture_run_messages() as captured:
            try:
                result = await self.agent.run(prompt_for(refund_id, request, case_file, self.limits), deps=deps)
            except Exception as error:  # the workflow fails such a refund without paying
                outcome = CaseOutcome(
                    order_id=order.id, stage="error", verdict="error", amount=Decimal(0), currency=order.currency,
                    error=f"{type(error).__name__}: {error}",
                )  # fmt: skip
                outcome.evidence = deps.evidence.model_dump(mode="json")
                return self._traced(outcome, captured, *_usage_from_messages(captured))
        usage = result.usage
        proposal = result.output
        snapshot = case_file.snapshot
        # As the workflow does: policy reads what the look-up steps returned, never the model's account of it.
        claim = case_claim(proposal, deps, case_file, refund_id)
        if snapshot is not None:  # the look-ups the workflow makes itself when the model did not
            claim = await complete_case(deps, claim, proposal, snapshot, self.limits, request.amount)
        verdict = policy_verdict(proposal, snapshot, self.limits, requested=request.amount, claim=claim)
        if claim.charges and verdict.kind == "auto_approve":  # as the workflow: refunds made outside it count
            claim = replace(claim, outside=await call(outside_refunds_step, dict(claim.charges)))
            verdict = policy_verdict(proposal, snapshot, self.limits, requested=request.amount, claim=claim)
        outcome = CaseOutcome(
            # The order policy judged, as the case file's read found it: what the verdict would pay, whatever the
            # case says.
            order_id=snapshot.order.order_id if snapshot is not None else request.order_id,
            stage="decided",
            verdict=verdict.kind,
            amount=verdict.amount if verdict.kind not in ("refuse", "ask_customer") else Decimal(0),
            currency=verdict.currency,
            proposed_amount=proposal.amount,
            proposed_currency=proposal.currency,
            reasons=list(verdict.reasons),
            reply=proposal.customer_reply,
            approver_reason=proposal.reason,
            category=proposal.category,
            evidence=deps.evidence.model_dump(mode="json"),
            question=verdict.question,
        )
        if verdict.question is not None and case.answer is not None:  # the customer answers; judged again with it
            again = self.read_case(request)
            answer = case.answer.answer(verdict.question)
            second, then = await judge_answer(refund_id, request, proposal, again, answer, self.limits, request.amount)
            paid = then.amount if then.kind != "refuse" else Decimal(0)
            evidence = second.evidence.model_dump(mode="json")
            outcome.answered = Answered(verdict=then.kind, amount=paid, reasons=list(then.reasons), evidence=evidence)
        return self._traced(outcome, result.all_messages(), usage.requests, usage.input_tokens, usage.output_tokens)

    @staticmethod
    def _traced(
        outcome: CaseOutcome, messages: list[ModelMessage], requests: int, tokens_in: int, tokens_out: int
    ) -> CaseOutcome:
        increment_eval_metric("model_requests", requests)
        increment_eval_metric("tokens_in", tokens_in)
        increment_eval_metric("tokens_out", tokens_out)
        return outcome.model_copy(
            update={
                "requests": requests,
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "tool_calls": tool_calls(messages),
                "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
            }
        )
