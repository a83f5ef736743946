"""The second judgement of a refund that asked its customer: the answer added to freshly read evidence, then policy.

``customer_rejudge_workflow`` (id ``{refund_id}/rejudge``, enqueued once by the answer workflow) reads the question
with its answer and the case it was asked on, reads the case file and the look-ups policy needs again (the same
steps, in this workflow), and judges through the same policy, which never asks twice: it parks the refund for a
person (an answer against the carrier's or the warehouse's record never pays on its own; the customer is thanked and
told a person reviews it), refuses, or pays where the evidence read again settles the claim without the answer (the
same payment path and key as a refund paid at once, so it pays once); each outcome tells the customer.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from dbos import DBOS

from agent.brain import AgentDeps
from agent.context import current
from agent.domain import Phase, RefundProposal, RefundRequest, Verdict
from agent.ops.offloop import call
from agent.policy import Claim, Limits
from agent.questions import REJUDGE_WORKFLOW, TO_PERSON_REASON
from agent.whole_case import case_claim, complete_case
from agent.workflow import evidence_decided, finish, park, policy_verdict, refuse, reserve_and_pay
from steps.evidence import CustomerAnswer, Evidence
from steps.faults import crash_point
from steps.orders import review_case_step
from steps.outside_refunds import outside_refunds_step
from steps.questions import lead_of_step, question_case_step
from steps.records import CaseFile


@DBOS.workflow(name=REJUDGE_WORKFLOW)
async def customer_rejudge_workflow(refund_id: str) -> dict[str, Any]:
    """The answered question -> evidence read again with the answer -> policy -> pay once, a person, or refuse."""
    rt = current()
    found = await call(question_case_step, refund_id)
    crash_point("after_answer_received")
    to_person = found is not None and found.question.state == "to_person"
    if found is None or (found.question.answer is None and not to_person):
        return await finish(refund_id, Phase.FAILED, "no answer was recorded for this refund's question", reply=None)
    req = RefundRequest.model_validate(found.case_file["request"])
    proposal = RefundProposal.model_validate(found.case_file["proposal"])
    asked = found.case_file.get("requested")
    requested = Decimal(asked) if asked is not None else None
    case = await call(review_case_step, req.order_id)
    claim, verdict = await judge_answer(refund_id, req, proposal, case, found.question.answer, rt.limits, requested)
    if to_person:  # a support lead sent it to a person: the order's facts alone may still refuse
        facts = policy_verdict(proposal, case.snapshot, rt.limits, requested=requested)
        lead = TO_PERSON_REASON.format(operator=f"support lead {await call(lead_of_step, refund_id)}")
        update = {"kind": "needs_approval", "question": None, "reasons": (lead, *verdict.reasons)}
        verdict = facts if facts.kind == "refuse" else verdict.model_copy(update=update)
    crash_point("after_rejudged")
    told = evidence_decided(proposal, verdict)  # approvers read policy's reasons (the answer's among them) first
    record: dict[str, Any] = {
        "proposal": told.model_dump(mode="json"),
        "verdict": verdict.model_dump(mode="json"),
        "model": rt.model_label,
        "usage": None,
        "evidence": claim.evidence.model_dump(mode="json"),
    }
    if verdict.kind == "auto_approve":
        return await reserve_and_pay(rt, refund_id, req.order_id, verdict, record, draft=None)
    if verdict.kind == "refuse":
        return await refuse(refund_id, verdict, record)
    return await park(rt, refund_id, verdict, told, record, answered=found.question.answer is not None)


async def judge_answer(
    refund_id: str,
    req: RefundRequest,
    proposal: RefundProposal,
    case: CaseFile,
    answer: CustomerAnswer | None,
    limits: Limits,
    requested: Decimal | None,
) -> tuple[Claim, Verdict]:
    """The second judgement (this workflow's, and the evaluations' play of a case's answer): the answer as evidence,
    the look-ups policy needs made again as the same steps, then policy. A refund asks once: a gap still left goes
    to a person."""
    deps = AgentDeps(refund_id, req, limits, snapshot=case.snapshot)
    deps.evidence = Evidence(answer=answer)
    claim = case_claim(proposal, deps, case, refund_id)
    if case.snapshot is not None:
        claim = await complete_case(deps, claim, proposal, case.snapshot, limits, requested)
    verdict = policy_verdict(proposal, case.snapshot, limits, requested=requested, claim=claim)
    if claim.charges and verdict.kind == "auto_approve":  # count the claimant's refunds made outside us first
        claim = replace(claim, outside=await call(outside_refunds_step, dict(claim.charges)))
        verdict = policy_verdict(proposal, case.snapshot, limits, requested=requested, claim=claim)
    if verdict.kind == "ask_customer":
        verdict = verdict.model_copy(update={"kind": "needs_approval"})
    return claim, verdict
