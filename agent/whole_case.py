"""Policy judges the whole case: the look-ups a claim needs that the model did not make, made by the workflow.

After the agent's run, ``whole_case`` asks policy what it still needs looked up (from the order's facts, the
model's category and the customer's words, and the charge's risk for a refund about to be paid at once) and makes
those look-ups as the same DBOS steps the agent's tools run. A refund recorded before these rules replays judged
by the model's category alone: the patch marks the refunds decided by them.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from dbos import DBOS

from agent import policy
from agent.brain import AgentDeps, look_up_for_policy
from agent.claim_reading import read_claim
from agent.domain import RefundProposal, Verdict
from steps.evidence import LookUp
from steps.records import CaseFile, OrderSnapshot

#: Durable: the patch recorded by refunds judged on the whole case: the look-ups the claim and the order need made by
#: the workflow when the model did not, every recorded fact counted, the customer's words read beside the model's
#: category (agent/policy.py). Refunds decided before it replay by the category alone. Retire it (then the
#: ``by_label`` rules) once no refund recorded without it can be PENDING.
WHOLE_CASE_PATCH = "whole-case"


def case_claim(proposal: RefundProposal, deps: AgentDeps, case: CaseFile, refund_id: str) -> policy.Claim:
    """The claim policy judges after the agent's run: the agent's category, the customer's words read without the
    model, what the look-up steps returned, and the claimant's refunds and the order's open claims as the case file
    read them (the workflow and the evaluations build it here, so they judge alike)."""
    return policy.Claim(
        proposal.category,
        deps.evidence,
        case.history,
        refund_id,
        words=read_claim(deps.request.message),
        open_claims=case.open_claims,
        charges=case.charges,
    )


def verdict_changes(judged: Verdict, verdict: Verdict) -> bool:
    """Whether the claim's rules changed what happens (not only what is noted)."""
    return (judged.kind, judged.amount, judged.reasons) != (verdict.kind, verdict.amount, verdict.reasons)


def _verdict(
    proposal: RefundProposal,
    snapshot: OrderSnapshot,
    limits: policy.Limits,
    *,
    requested: Decimal | None,
    claim: policy.Claim,
) -> Verdict:
    order, as_of, amount, currency = snapshot.order, snapshot.as_of, proposal.amount, proposal.currency
    return policy.decide(
        amount=amount, currency=currency, order=order, as_of=as_of, limits=limits, requested=requested, claim=claim
    )


async def whole_case(
    deps: AgentDeps,
    claim: policy.Claim,
    proposal: RefundProposal,
    snapshot: OrderSnapshot | None,
    limits: policy.Limits,
    requested: Decimal | None,
) -> tuple[policy.Claim, bool]:
    """Make the look-ups policy needs that the model did not (the same steps its tools run), so policy judges the
    whole case; and whether the whole-case rules decide (``WHOLE_CASE_PATCH`` taken). Where those rules change
    nothing and need nothing, no checkpoint is spent; a refund recorded before them is judged by its label."""
    if snapshot is None:
        return claim, False
    label = replace(claim, by_label=True)
    missing = wanted_look_ups(claim, proposal, snapshot, limits, requested)
    differs = any(
        verdict_changes(
            _verdict(proposal, snapshot, limits, requested=bound, claim=claim),
            _verdict(proposal, snapshot, limits, requested=bound, claim=label),
        )
        for bound in {requested, None}
    )
    if not (missing or differs):
        return claim, False
    if not await DBOS.patch_async(WHOLE_CASE_PATCH):
        return label, False
    return await complete_case(deps, claim, proposal, snapshot, limits, requested), True


def wanted_look_ups(
    claim: policy.Claim,
    proposal: RefundProposal,
    snapshot: OrderSnapshot,
    limits: policy.Limits,
    requested: Decimal | None,
) -> tuple[LookUp, ...]:
    order, as_of, amount, currency = snapshot.order, snapshot.as_of, proposal.amount, proposal.currency
    return policy.look_ups_wanted(
        amount=amount, currency=currency, order=order, as_of=as_of, limits=limits, requested=requested, claim=claim
    )


async def complete_case(
    deps: AgentDeps,
    claim: policy.Claim,
    proposal: RefundProposal,
    snapshot: OrderSnapshot,
    limits: policy.Limits,
    requested: Decimal | None,
) -> policy.Claim:
    """The look-ups policy still wants, made as the same steps the tools run, until it wants none (evaluations
    call this too, so they judge what the workflow judges)."""
    for _ in range(4):  # four kinds of look-up, each made at most once: a round adds one at least
        missing = wanted_look_ups(claim, proposal, snapshot, limits, requested)
        if not missing:
            break
        for name in missing:
            await look_up_for_policy(deps, name)
        claim = replace(claim, evidence=deps.evidence)
    return claim
