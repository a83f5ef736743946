"""The durable refund workflow: a script of named steps, checkpointed one by one."""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS

from agent import approvals, policy
from agent.brain import AgentDeps, prompt_for
from agent.domain import OUTCOME_EVENT, PHASE_EVENT, Phase, RefundProposal, RefundRequest, Verdict
from agent.runtime import current
from steps.notify import notify_customer_step
from steps.orders import load_order_step
from steps.payments import idempotency_key, issue_refund_step
from steps.refunds import prepare_payment_step, record_outcome_step, record_payment_step, record_verdict_step

log = logging.getLogger(__name__)

# Durable name: recorded with every workflow; never rename it.
REFUND_WORKFLOW = "refund_workflow"


@DBOS.workflow(name=REFUND_WORKFLOW)
async def refund_workflow(refund_id: str, request: dict[str, Any]) -> dict[str, Any]:
    """Agent proposes -> policy decides -> a person approves if needed -> pay once -> record -> tell."""
    rt = current()
    req = RefundRequest.model_validate(request)
    await DBOS.set_event_async(PHASE_EVENT, Phase.DECIDING.value)
    try:
        run = await rt.agent.run(prompt_for(req), deps=AgentDeps(refund_id, req, rt.limits))
    except Exception as error:  # the model failed or misbehaved through its retries: nothing was paid
        log.error("refund %s: the agent could not decide: %s", refund_id, type(error).__name__)
        detail = f"the agent could not decide ({type(error).__name__}); fork the workflow to retry"
        return await _finish(refund_id, req, Phase.FAILED, detail, None)
    proposal = run.output
    verdict = policy_verdict(req, proposal, rt.limits)
    record_verdict_step(
        refund_id,
        proposal=proposal.model_dump(mode="json"),
        verdict=verdict.model_dump(mode="json"),
        model=rt.model_label,
    )
    if verdict.kind == "refuse":
        return await _finish(refund_id, req, Phase.REJECTED, verdict.summary, proposal.customer_reply)
    if verdict.kind == "needs_approval":
        decision = await approvals.await_decision(refund_id, verdict, reason=proposal.reason, config=rt.approvals)
        if decision.decision != "approve" or (decision.amount, decision.currency) != (
            verdict.amount,
            verdict.currency,
        ):
            detail = f"approval {decision.decision} by {decision.approver}"
            return await _finish(refund_id, req, Phase.REJECTED, detail, _declined_reply(verdict))

    await DBOS.set_event_async(PHASE_EVENT, Phase.PAYING.value)
    plan = prepare_payment_step(refund_id, req.order_id, amount=verdict.amount, currency=verdict.currency)
    if plan.snapshot is None:
        return await _finish(refund_id, req, Phase.FAILED, "the order disappeared", _declined_reply(verdict))
    order = plan.snapshot.order
    recheck = policy.decide(
        amount=verdict.amount,
        currency=verdict.currency,
        order=order,
        as_of=plan.snapshot.as_of,
        limits=rt.limits,
    )
    if recheck.kind == "refuse":
        return await _finish(
            refund_id,
            req,
            Phase.REJECTED,
            f"re-check before paying: {recheck.summary}",
            _declined_reply(verdict),
        )
    try:
        payment = issue_refund_step(
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
        return await _finish(refund_id, req, Phase.FAILED, detail, None)
    record_payment_step(refund_id, order.order_id, payment)
    reply = proposal.customer_reply if verdict.kind == "auto_approve" else _paid_reply(verdict)
    notify_customer_step(refund_id, customer_id=order.customer_id, text=reply)
    outcome = {
        "refund_id": refund_id,
        "status": Phase.COMPLETED.value,
        "amount": str(payment.amount),
        "currency": payment.currency,
        "provider_refund_id": payment.provider_refund_id,
        "idempotency_key": payment.idempotency_key,
        "model": rt.model_label,
    }
    await DBOS.set_event_async(OUTCOME_EVENT, outcome)
    await DBOS.set_event_async(PHASE_EVENT, Phase.COMPLETED.value)
    return outcome


def policy_verdict(req: RefundRequest, proposal: RefundProposal, limits: policy.Limits) -> Verdict:
    """Policy's verdict on the proposal, against the order as it is now (read in a step)."""
    snapshot = load_order_step(req.order_id)
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


async def _finish(refund_id: str, req: RefundRequest, phase: Phase, detail: str, reply: str | None) -> dict[str, Any]:
    status = phase.value
    assert status in ("rejected", "failed", "cancelled")
    record_outcome_step(refund_id, status=status, detail=detail)  # type: ignore[arg-type]
    if reply:
        snapshot = load_order_step(req.order_id)
        customer = snapshot.order.customer_id if snapshot else "unknown"
        notify_customer_step(refund_id, customer_id=customer, text=reply)
    outcome = {"refund_id": refund_id, "status": status, "detail": detail}
    await DBOS.set_event_async(OUTCOME_EVENT, outcome)
    await DBOS.set_event_async(PHASE_EVENT, status)
    return outcome
