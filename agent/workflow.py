"""The refund's workflows: each a script of named steps, checkpointed one by one.

``refund_workflow`` (durable name ``refund``, id = the request's Idempotency-Key) reads the case file,
asks the agent once, and decides: it pays at once, refuses, or parks the refund for a person and ends.
``settle_refund_workflow`` (id ``{refund_id}/settle``) is started by the decision and finishes a parked
refund. Between the two, nothing runs (agent/approval_workflows.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from decimal import Decimal
from typing import Any

from dbos import DBOS
from pydantic_ai.usage import RunUsage

from agent import approvals, model_calls, policy, replies
from agent.approval_workflows import start_timers
from agent.brain import AgentDeps, prompt_for
from agent.claims import evidence_lines
from agent.context import Runtime, current
from agent.domain import ApprovalRecord, Phase, RefundProposal, RefundRequest, Verdict
from agent.ops.offloop import call
from agent.question_workflows import ask_customer
from agent.questions import ASK_CUSTOMER_PATCH
from agent.settlement import park_payment, settle
from agent.whole_case import case_claim, verdict_changes, whole_case
from steps.approval_book import open_approval_step, standing_decision_step
from steps.evidence import Evidence
from steps.faults import crash_point
from steps.notify import CustomerMessage, notify_approvers_step, slack_approvers_step, slack_enabled
from steps.orders import review_case_step
from steps.outside_refunds import outside_refunds_step
from steps.payments import ChargeDisputed, describe_failure, idempotency_key, issue_refund_step
from steps.records import ModelUsage, OrderSnapshot
from steps.refunds import PaymentPlan, record_outcome_step, record_refusal_step, record_verdict_step
from steps.reservations import prepare_approved_payment_step, record_payment_step, record_verdict_and_reserve_step
from steps.settlement import SettlingPayment

log = logging.getLogger(__name__)

# Durable name: recorded with every workflow; never rename it. (Refunds started before the case file
# run as ``refund_workflow``, agent/legacy.py.)
REFUND_WORKFLOW = "refund"
REFUND_QUEUE = "refunds"  # durable: enqueued refunds name it
#: Durable: the patch recorded by refunds whose verdict the customer's requested amount bounded.
REQUEST_BOUND_PATCH = "request-bound"
#: Durable: the patch recorded by refunds whose verdict the claim's evidence or the customer's recent refunds changed.
EVIDENCE_PATCH = "evidence-rules"
#: Durable: the patch recorded by refunds the model could not decide that went to a person instead of failing.
MODEL_OUTAGE_PATCH = "model-outage-to-person"
#: How long a continuation waits for the decision its decision workflow sends right after starting it.
HANDOVER_TIMEOUT_SECONDS = 30.0


@DBOS.workflow(name=REFUND_WORKFLOW)
async def refund_workflow(refund_id: str, request: dict[str, Any]) -> dict[str, Any]:
    """Case file -> agent proposes -> policy decides -> pay now, refuse, or park for a person and end."""
    rt = current()
    req = RefundRequest.model_validate(request)
    case = await call(review_case_step, req.order_id)
    deps = AgentDeps(refund_id, req, rt.limits, snapshot=case.snapshot)
    usage = RunUsage()
    try:
        prompt = prompt_for(refund_id, req, case, rt.limits)
        run = await rt.agent.run(prompt, deps=deps, usage=usage, usage_limits=rt.usage_limits)
    except Exception as error:  # the model failed or misbehaved through its retries: nothing was paid
        if model_calls.from_the_model(error) and await DBOS.patch_async(MODEL_OUTAGE_PATCH):
            return await to_a_person(rt, refund_id, req, case.snapshot, model_calls.why_undecided(error), usage)
        return await undecided(rt, refund_id, error, usage)
    # Policy reads what the look-up steps returned (deps.evidence), never the model's account of it.
    claim = case_claim(run.output, deps, case, refund_id)
    claim, whole = await whole_case(deps, claim, run.output, case.snapshot, rt.limits, req.amount)
    return await act_on(rt, refund_id, req, run.output, case.snapshot, usage, claim=claim, whole_case=whole)


async def reserve_and_pay(
    rt: Runtime, refund_id: str, order_id: str, verdict: Verdict, record: dict[str, Any], *, draft: str | None
) -> dict[str, Any]:
    """Record the verdict and reserve its amount in one step, then pay it under the refund's key."""
    plan = await call(
        record_verdict_and_reserve_step,
        refund_id,
        order_id,
        **record,
        amount=verdict.amount,
        currency=verdict.currency,
        open_claims_allowed=rt.limits.order_max_open_claims,
    )
    return await pay(rt, refund_id, verdict.amount, verdict.currency, plan, draft=draft)


async def undecided(rt: Runtime, refund_id: str, error: Exception, usage: RunUsage) -> dict[str, Any]:
    log.error("refund %s: the agent could not decide: %s", refund_id, type(error).__name__)
    detail = f"the agent could not decide ({type(error).__name__}); fork the workflow to retry"
    return await finish(refund_id, Phase.FAILED, detail, reply=None, usage=usage_record(usage, rt.model_label))


async def to_a_person(
    rt: Runtime, refund_id: str, req: RefundRequest, snapshot: OrderSnapshot | None, why: str, usage: RunUsage
) -> dict[str, Any]:
    """The model could not decide (down through every retry, past the refund's usage limit, or its answers unusable):
    a person decides on the order's facts instead, reading why; the customer is told it is being reviewed. Nothing is
    paid without that person, and what policy refuses on the order's facts alone is refused as ever."""
    log.error("refund %s: the model could not decide, sent to a person: %s", refund_id, why)
    if snapshot is None:  # policy refuses: the order does not exist
        amount, currency = req.amount or Decimal(0), req.currency or "USD"
    else:
        refundable = policy.refundable(snapshot.order, snapshot.as_of, rt.limits.window_days)
        amount = min(req.amount, refundable) if req.amount is not None else refundable
        currency = snapshot.order.currency
    reason = f"No proposal: {why}. The amount is what the customer asked for, at most what is refundable; decide it."
    proposal = RefundProposal(amount=amount, currency=currency, reason=reason, customer_reply="", category="other")
    verdict = policy_verdict(proposal, snapshot, rt.limits, requested=req.amount)
    if verdict.kind != "refuse":  # the order's facts alone may refuse; nothing else is decided without a person
        verdict = verdict.model_copy(update={"kind": "needs_approval", "reasons": (why, *verdict.reasons)})
    record: dict[str, Any] = {
        "proposal": proposal.model_dump(mode="json"),
        "verdict": verdict.model_dump(mode="json"),
        "model": rt.model_label,
        "usage": usage_record(usage, rt.model_label),
    }
    if verdict.kind == "refuse":
        return await refuse(refund_id, verdict, record)
    return await park(rt, refund_id, verdict, proposal, record)


async def act_on(
    rt: Runtime,
    refund_id: str,
    req: RefundRequest,
    proposal: RefundProposal,
    snapshot: OrderSnapshot | None,
    usage: RunUsage,
    *,
    legacy: bool = False,
    claim: policy.Claim | None = None,
    whole_case: bool = False,
) -> dict[str, Any]:
    """Policy judges the proposal against the order as the case file's step read it, and the claim against the
    evidence its look-ups recorded; then pay, refuse or park."""
    crash_point("after_model_response")
    asked_on = proposal  # what the customer's answer is judged again with, as the model proposed it
    verdict = policy_verdict(proposal, snapshot, rt.limits, requested=req.amount)
    # The request's bound changed the amount. A refund that a release without the bound decided and recorded
    # past this point replays as it was recorded; the patch marks the refunds decided with the bound.
    bounded = verdict.amount != proposal.amount and await DBOS.patch_async(REQUEST_BOUND_PATCH)
    requested = req.amount if bounded or verdict.amount == proposal.amount else None
    if requested is None:
        verdict = policy_verdict(proposal, snapshot, rt.limits, requested=None)
    judged = verdict
    if claim is not None:  # the evidence and the customer's recent refunds: the same patch rule
        judged = policy_verdict(proposal, snapshot, rt.limits, requested=requested, claim=claim)
        if judged.kind == "ask_customer" and not await DBOS.patch_async(ASK_CUSTOMER_PATCH):
            # A refund decided before questions replays as recorded: what the gap meant then (a person, a refusal).
            silent = replace(rt.limits, questions=frozenset())
            judged = policy_verdict(proposal, snapshot, silent, requested=requested, claim=claim)
        # A refund judged on the whole case recorded its own patch, which implies this one.
        if verdict_changes(judged, verdict) and not whole_case and not await DBOS.patch_async(EVIDENCE_PATCH):
            judged = verdict
    if claim is not None and claim.charges and judged.kind == "auto_approve":
        # Paid at once (the one verdict the repeat rule changes): first count the refunds the provider made on the
        # claimant's charges outside this service. A case file from before charges were read has none: it replays
        # without this step.
        claim = replace(claim, outside=await call(outside_refunds_step, dict(claim.charges)))
        judged = policy_verdict(proposal, snapshot, rt.limits, requested=requested, claim=claim)
    record: dict[str, Any] = {
        "proposal": proposal.model_dump(mode="json"),
        "verdict": judged.model_dump(mode="json"),
        "model": rt.model_label,
        "usage": usage_record(usage, rt.model_label),
    }
    if claim is not None:
        record["evidence"] = claim.evidence.model_dump(mode="json")
    if bounded:  # the model's words are about an amount that is never paid: approvers and the customer read policy's
        proposal = over_the_request(proposal, judged)
    elif judged is not verdict and verdict_changes(judged, verdict):  # the evidence decided: approvers read why first
        proposal = evidence_decided(proposal, judged)
    verdict = judged
    if verdict.kind == "auto_approve":  # nothing to wait for: the verdict and the reservation commit together
        return await reserve_and_pay(rt, refund_id, req.order_id, verdict, record, draft=proposal.customer_reply)
    # A refusal tells the customer why in plain words (or, where the evidence decided, policy's note): the model's
    # draft was written before policy judged it and may promise a review that never comes.
    if verdict.kind == "refuse" and legacy:  # as recorded before record_refusal: two steps
        await call(record_verdict_step, refund_id, **record)
        reply = verdict.customer_note or replies.refused(amount_asked(verdict), verdict.currency, verdict.reasons)
        return await finish(refund_id, Phase.REJECTED, verdict.summary, reply=reply)
    if verdict.kind == "refuse":
        return await refuse(refund_id, verdict, record)
    if verdict.kind == "ask_customer":
        return await ask_customer(rt, refund_id, req, verdict, asked_on, record, requested=requested)
    return await park(rt, refund_id, verdict, proposal, record)


async def refuse(refund_id: str, verdict: Verdict, record: dict[str, Any]) -> dict[str, Any]:
    """Policy refused: the verdict, the outcome and the customer's message (why, in plain words, or where the
    evidence decided, policy's note) commit together."""
    reply = verdict.customer_note or replies.refused(amount_asked(verdict), verdict.currency, verdict.reasons)
    await call(record_refusal_step, refund_id, **record, detail=verdict.summary, reply=reply)
    return {"refund_id": refund_id, "status": Phase.REJECTED.value, "detail": verdict.summary}


def amount_asked(verdict: Verdict) -> Decimal:
    """The amount a refusal names: what the customer asked for, else the amount policy judged (0 when nothing was
    refundable, which agent/replies.py never writes as an amount)."""
    return verdict.requested if verdict.requested is not None else verdict.amount


def evidence_decided(proposal: RefundProposal, verdict: Verdict) -> RefundProposal:
    """What approvers and the customer read when the evidence changed the verdict: policy's reasons first, the
    agent's account after them; a lower amount (the lines a warehouse received) gets our reply, not the model's."""
    said = "; ".join(verdict.reasons)
    update: dict[str, Any] = {"reason": f"{said}. The agent's reason: {proposal.reason}"[:1000]}
    if verdict.kind == "auto_approve" and verdict.amount != proposal.amount:
        update["customer_reply"] = replies.paid(verdict.amount, verdict.currency)
    return proposal.model_copy(update=update)


def over_the_request(proposal: RefundProposal, verdict: Verdict) -> RefundProposal:
    """What approvers and the customer read of a proposal above the requested amount: policy's reasons first (the
    approval is for the requested amount), the agent's account after them, marked as such; the draft kept for the
    customer is ours."""
    said = "; ".join(verdict.reasons)
    return proposal.model_copy(
        update={
            "reason": f"{said}. The agent's reason, unchecked: {proposal.reason}",
            "customer_reply": replies.refused(verdict.amount, verdict.currency, verdict.reasons),
        }
    )


def usage_record(usage: RunUsage, model: str) -> ModelUsage:
    return ModelUsage(
        model=model, requests=usage.requests, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens
    )


async def park(
    rt: Runtime,
    refund_id: str,
    verdict: Verdict,
    proposal: RefundProposal,
    record: dict[str, Any],
    *,
    answered: bool = False,
) -> dict[str, Any]:
    """Record the request, set its deadline and reminder, ask approvers and tell the customer it waits for a person
    (one step; ``answered``: with the answer they gave to its question); then end: waiting is rows."""
    config = rt.approvals
    request = await call(
        open_approval_step,
        refund_id,
        **record,
        amount=verdict.amount,
        currency=verdict.currency,
        reason=proposal.reason,
        escalate_after=config.escalate_after,
        timeout=config.timeout,
    )
    await start_timers(request, config)
    found = record.get("evidence")  # approvers read what was looked up, as policy judged it
    lines = evidence_lines(Evidence.model_validate(found)) if found is not None else None
    text = approvals.request_text(request, category=proposal.category if found is not None else None, evidence=lines)
    links = approvals.approver_links(config, approvals.claims_of(request, approver=""))
    messages = {name: f"{text}\nDecide: {url}" for name, url in links.items()}  # each link decides as its approver
    # heard from again by the deadline
    told = replies.waiting(request.amount, request.currency, request.expires_at, answered=answered)
    await call(notify_approvers_step, refund_id, kind="request", messages=messages, customer_text=told)
    if slack_enabled():  # the buttons decide as the clicking user, if the allow-list maps them to an approver
        token, _ = approvals.link(config, approvals.claims_of(request, approvals.SLACK_APPROVER))
        console = f"{config.public_url.rstrip('/')}/console/refunds/{refund_id}"
        await call(slack_approvers_step, refund_id, text=text, link=console, token=token)
    return {
        "refund_id": refund_id,
        "status": Phase.AWAITING_APPROVAL.value,
        "expires_at": request.expires_at.isoformat(),
    }


@DBOS.workflow(name=approvals.SETTLE_WORKFLOW)
async def settle_refund_workflow(refund_id: str) -> dict[str, Any]:
    """A parked refund, decided: receive the decision, re-check against the order, pay once, record, tell."""
    rt = current()
    message = await DBOS.recv_async(approvals.APPROVAL_TOPIC, timeout_seconds=HANDOVER_TIMEOUT_SECONDS)
    # The decision workflow sends right after starting us; if it stopped in between, its record stands.
    decision = ApprovalRecord.model_validate(message) if message else await call(standing_decision_step, refund_id)
    crash_point("after_approval_received")
    if decision is None:
        return await finish(refund_id, Phase.FAILED, "no decision was recorded for this refund", reply=None)
    amount, currency = decision.amount, decision.currency
    if decision.decision != "approve":
        detail = f"approval {decision.decision} by {decision.approver}"
        return await finish(refund_id, Phase.REJECTED, detail, reply=replies.rejected_by_person(amount, currency))
    plan = await call(prepare_approved_payment_step, refund_id, amount=amount, currency=currency)
    return await pay(rt, refund_id, amount, currency, plan, draft=None)


async def pay(
    rt: Runtime, refund_id: str, amount: Decimal, currency: str, plan: PaymentPlan, *, draft: str | None
) -> dict[str, Any]:
    """Re-check against the order as reserved and the amount the customer asked for, pay with the request's key,
    book it and tell the customer what was paid (the model's ``draft`` only where it fits, agent/replies.py); a
    refusal names the amount the customer asked for (``amount`` when they named none)."""
    asked = plan.requested if plan.requested is not None else amount
    if plan.snapshot is None:
        phase = Phase.REJECTED if plan.refusal else Phase.FAILED
        detail = plan.refusal or "the order disappeared"
        return await finish(refund_id, phase, detail, reply=replies.refused(asked, currency, [detail]))
    order, as_of = plan.snapshot.order, plan.snapshot.as_of
    recheck = policy.recheck(
        amount=amount, currency=currency, order=order, as_of=as_of, limits=rt.limits, requested=plan.requested
    )
    if recheck.kind == "refuse":
        detail = f"re-check before paying: {recheck.summary}"
        return await finish(refund_id, Phase.REJECTED, detail, reply=replies.refused(asked, currency, recheck.reasons))
    try:
        payment = await call(
            issue_refund_step,
            refund_id=refund_id,
            order_id=order.order_id,
            charge_id=order.charge_id,
            amount=amount,
            currency=currency,
            first_attempt_at=plan.first_attempt_at,
        )
    except ChargeDisputed as error:  # the dispute decides: a refusal, and the customer is told why
        detail = f"the payment provider refused: {error}; the open dispute decides"
        return await finish(refund_id, Phase.REJECTED, detail, reply=replies.refused(asked, currency, [detail]))
    except Exception as error:  # the provider refused or stayed down through every retry
        log.error("refund %s: payment failed: %s", refund_id, describe_failure(error))
        key = idempotency_key(refund_id, order.order_id)
        detail = f"payment failed ({describe_failure(error)}); fork from the payment step to retry with key {key}"
        return await finish(refund_id, Phase.FAILED, detail, reply=None)
    if payment.status in ("pending", "requires_action"):  # the provider has not settled: wait as rows
        return await park_payment(refund_id, payment)
    if payment.status != "succeeded":  # failed or canceled at once: nothing was sent
        settling = SettlingPayment(
            refund_id=refund_id,
            order_id=order.order_id,
            customer_id=order.customer_id,
            status=Phase.PAYING.value,
            provider_refund_id=payment.provider_refund_id,
            idempotency_key=payment.idempotency_key,
            amount=amount,
            currency=currency,
        )
        return await settle(settling, payment)
    message = CustomerMessage(order.customer_id, replies.paid_at_once(draft, payment.amount, payment.currency))
    await call(record_payment_step, refund_id, order.order_id, payment, notify=message)  # book and message together
    return {
        "refund_id": refund_id,
        "status": Phase.COMPLETED.value,
        "amount": str(payment.amount),
        "currency": payment.currency,
        "provider_refund_id": payment.provider_refund_id,
        "idempotency_key": payment.idempotency_key,
        "model": rt.model_label,
    }


async def finish(
    refund_id: str, phase: Phase, detail: str, *, reply: str | None, usage: ModelUsage | None = None
) -> dict[str, Any]:
    """End without paying: the outcome and the customer's message commit together."""
    status = phase.value
    assert status in ("rejected", "failed", "cancelled")
    await call(record_outcome_step, refund_id, status=status, detail=detail, reply=reply, usage=usage)  # type: ignore[arg-type]
    return {"refund_id": refund_id, "status": status, "detail": detail}


def policy_verdict(
    proposal: RefundProposal,
    snapshot: OrderSnapshot | None,
    limits: policy.Limits,
    *,
    requested: Decimal | None,
    claim: policy.Claim | None = None,
) -> Verdict:
    """Policy's verdict on the proposal, against the order as a step read it, bounded by ``requested`` (what the
    customer asked for; None: no amount named)."""
    if snapshot is None:
        return Verdict(
            kind="refuse",
            amount=proposal.amount,
            currency=proposal.currency,
            reasons=("the order does not exist",),
            requested=requested,
        )
    return policy.decide(
        amount=proposal.amount,
        currency=proposal.currency,
        order=snapshot.order,
        as_of=snapshot.as_of,
        limits=limits,
        requested=requested,
        claim=claim,
    )
