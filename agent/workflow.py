"""The durable refund workflow: a script of named steps, checkpointed one by one."""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS

from agent import approvals, policy
from agent.brain import AgentDeps, prompt_for
from agent.domain import OUTCOME_EVENT, PHASE_EVENT, Phase, RefundProposal, RefundRequest, Verdict
from agent.offloop import call
from agent.runtime import current
from steps.notify import CustomerMessage, notify_customer_step
from steps.orders import load_order_step
from steps.payments import idempotency_key, issue_refund_step
from steps.records import OrderSnapshot
from steps.refunds import (
    PaymentPlan,
    prepare_payment_step,
    record_outcome_step,
    record_payment_step,
    record_verdict_and_reserve_step,
    record_verdict_step,
)

log = logging.getLogger(__name__)

# Durable name: recorded with every workflow; never rename it.
REFUND_WORKFLOW = "refund_workflow"
# Durable patch name: refunds started with it write fewer checkpoints (see README, "Checkpoints").
LEAN_CHECKPOINTS = "lean-checkpoints"


@DBOS.workflow(name=REFUND_WORKFLOW)
async def refund_workflow(refund_id: str, request: dict[str, Any]) -> dict[str, Any]:
    """Agent proposes -> policy decides -> a person approves if needed -> pay once -> record -> tell."""
    rt = current()
    req = RefundRequest.model_validate(request)
    # Refunds started before this patch replay the old shape: phase events and separate read/notify steps.
    lean = await DBOS.patch_async(LEAN_CHECKPOINTS)
    if not lean:
        await DBOS.set_event_async(PHASE_EVENT, Phase.DECIDING.value)
    deps = AgentDeps(refund_id, req, rt.limits)
    try:
        # Only the output is kept: a refund parked for approval holds its frame for days, and the run's
        # message history would stay in memory with it.
        proposal = (await rt.agent.run(prompt_for(req), deps=deps)).output
    except Exception as error:  # the model failed or misbehaved through its retries: nothing was paid
        log.error("refund %s: the agent could not decide: %s", refund_id, type(error).__name__)
        detail = f"the agent could not decide ({type(error).__name__}); fork the workflow to retry"
        return await _finish(refund_id, req, Phase.FAILED, detail, None, lean=lean, snapshot=deps.snapshot)
    # The agent's own read of the order (a step) is the one policy judges; the old shape read it again.
    snapshot = deps.snapshot if lean and deps.snapshot is not None else await call(load_order_step, req.order_id)
    verdict = policy_verdict(proposal, snapshot, rt.limits)
    record = {"proposal": proposal.model_dump(mode="json"), "verdict": verdict.model_dump(mode="json")}
    plan: PaymentPlan | None = None
    if lean and verdict.kind == "auto_approve":  # nothing to wait for: the verdict and the reservation commit together
        plan = await call(
            record_verdict_and_reserve_step,
            refund_id,
            req.order_id,
            **record,
            model=rt.model_label,
            amount=verdict.amount,
            currency=verdict.currency,
        )
    else:
        await call(record_verdict_step, refund_id, **record, model=rt.model_label)
    if verdict.kind == "refuse":
        reply = proposal.customer_reply
        return await _finish(refund_id, req, Phase.REJECTED, verdict.summary, reply, lean=lean, snapshot=snapshot)
    if verdict.kind == "needs_approval":
        decision = await approvals.await_decision(
            refund_id, verdict, reason=proposal.reason, config=rt.approvals, publish_phase=not lean
        )
        if decision.decision != "approve" or (decision.amount, decision.currency) != (
            verdict.amount,
            verdict.currency,
        ):
            detail = f"approval {decision.decision} by {decision.approver}"
            reply = _declined_reply(verdict)
            return await _finish(refund_id, req, Phase.REJECTED, detail, reply, lean=lean, snapshot=snapshot)

    if plan is None:
        if not lean:
            await DBOS.set_event_async(PHASE_EVENT, Phase.PAYING.value)
        amount, currency = verdict.amount, verdict.currency
        plan = await call(prepare_payment_step, refund_id, req.order_id, amount=amount, currency=currency)
    if plan.snapshot is None:
        reply = _declined_reply(verdict)
        return await _finish(refund_id, req, Phase.FAILED, "the order disappeared", reply, lean=lean, snapshot=None)
    order = plan.snapshot.order
    recheck = policy.decide(
        amount=verdict.amount,
        currency=verdict.currency,
        order=order,
        as_of=plan.snapshot.as_of,
        limits=rt.limits,
    )
    if recheck.kind == "refuse":
        detail = f"re-check before paying: {recheck.summary}"
        reply = _declined_reply(verdict)
        return await _finish(refund_id, req, Phase.REJECTED, detail, reply, lean=lean, snapshot=plan.snapshot)
    try:
        payment = await call(
            issue_refund_step,
            refund_id=refund_id,
            order_id=order.order_id,
            charge_id=order.charge_id,
            amount=verdict.amount,
            currency=verdict.currency,
            first_attempt_at=plan.first_attempt_at,
        )
    except Exception as error:  # the provider refused or stayed down through every retry
        log.error("refund %s: payment failed: %s", refund_id, type(error).__name__)
        key = idempotency_key(refund_id, order.order_id)
        detail = f"payment failed ({type(error).__name__}); fork from the payment step to retry with key {key}"
        return await _finish(refund_id, req, Phase.FAILED, detail, None, lean=lean, snapshot=plan.snapshot)
    reply = proposal.customer_reply if verdict.kind == "auto_approve" else _paid_reply(verdict)
    message = CustomerMessage(customer_id=order.customer_id, text=reply)
    if lean:  # the book and the customer's message commit together
        await call(record_payment_step, refund_id, order.order_id, payment, notify=message)
    else:
        await call(record_payment_step, refund_id, order.order_id, payment)
        await call(notify_customer_step, refund_id, customer_id=message.customer_id, text=message.text)
    outcome = {
        "refund_id": refund_id,
        "status": Phase.COMPLETED.value,
        "amount": str(payment.amount),
        "currency": payment.currency,
        "provider_refund_id": payment.provider_refund_id,
        "idempotency_key": payment.idempotency_key,
        "model": rt.model_label,
    }
    if not lean:
        await DBOS.set_event_async(OUTCOME_EVENT, outcome)
        await DBOS.set_event_async(PHASE_EVENT, Phase.COMPLETED.value)
    return outcome


def policy_verdict(proposal: RefundProposal, snapshot: OrderSnapshot | None, limits: policy.Limits) -> Verdict:
    """Policy's verdict on the proposal, against the order as a step read it."""
    if snapshot is None:
        return Verdict(
            kind="refuse",
            amount=proposal.amount,
            currency=proposal.currency,
            reasons=("the order does not exist",),
        )
    return policy.decide(
        amount=proposal.amount,
        currency=proposal.currency,
        order=snapshot.order,
        as_of=snapshot.as_of,
        limits=limits,
    )


def _paid_reply(verdict: Verdict) -> str:
    return (
        f"Your refund of {verdict.amount} {verdict.currency} has been approved and sent. It will reach your "
        "original payment method within 5-10 business days."
    )


def _declined_reply(verdict: Verdict) -> str:
    return (
        f"We are sorry: after review we cannot refund {verdict.amount} {verdict.currency} on this order. "
        "Reply to this message if you would like us to take another look."
    )


async def _finish(
    refund_id: str,
    req: RefundRequest,
    phase: Phase,
    detail: str,
    reply: str | None,
    *,
    lean: bool,
    snapshot: OrderSnapshot | None,
) -> dict[str, Any]:
    status = phase.value
    assert status in ("rejected", "failed", "cancelled")
    outcome = {"refund_id": refund_id, "status": status, "detail": detail}
    if lean:  # the outcome and the customer's message commit together; the workflow's result is the outcome
        customer = snapshot.order.customer_id if snapshot else "unknown"
        message = CustomerMessage(customer_id=customer, text=reply) if reply else None
        await call(record_outcome_step, refund_id, status=status, detail=detail, notify=message)  # type: ignore[arg-type]
        return outcome
    await call(record_outcome_step, refund_id, status=status, detail=detail)  # type: ignore[arg-type]
    if reply:
        reread = await call(load_order_step, req.order_id)
        customer = reread.order.customer_id if reread else "unknown"
        await call(notify_customer_step, refund_id, customer_id=customer, text=reply)
    await DBOS.set_event_async(OUTCOME_EVENT, outcome)
    await DBOS.set_event_async(PHASE_EVENT, status)
    return outcome
