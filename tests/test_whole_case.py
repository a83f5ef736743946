"""Policy judges the whole case, not the model's label: real refund workflows on SQLite and Postgres.

A model that files every claim as ``damaged`` gets paid nothing the offline model (which names the right category)
would not; a customer's rewording ("I didn't get it", "parcel lost") gets the look-up the claim needs even when the
model makes none; an honest claim on a charge with an open dispute is refused; and a refund a person approved on a
charged-back charge is refused by the provider (``charge_disputed``) and recorded as refused, not paid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from dbos import DBOSClient
from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent import approvals, runtime
from agent.approval_workflows import decide_here
from agent.domain import RecordedProposal, RefundProposal
from agent.offline import offline_model, offline_model_function
from agent.ops.processes import wait_for
from agent.status import refund_status
from tests.conftest import Env
from tests.identities import DANA
from tests.test_investigation import entries, row, steps_of
from tests.test_workflow import parked, result, running, submit

_SETTLED = ("awaiting_approval", "awaiting_customer", "completed", "rejected", "failed")


def _always_damaged(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The offline model's look-ups and amounts, with every answer filed as ``damaged``."""
    response = offline_model_function(messages, info)
    output = info.output_tools[0].name
    parts = [
        ToolCallPart(p.tool_name, {**p.args, "category": "damaged"}, p.tool_call_id)
        if isinstance(p, ToolCallPart) and p.tool_name == output and isinstance(p.args, dict)
        else p
        for p in response.parts
    ]
    return ModelResponse(parts=parts, model_name="always damaged")


def _damaged_model() -> FunctionModel:
    return FunctionModel(_always_damaged)


MODELS: dict[str, Callable[[], FunctionModel]] = {"offline": offline_model, "always damaged": _damaged_model}


@pytest.fixture(params=list(MODELS))
def model_client(request: pytest.FixtureRequest, env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[DBOSClient]:
    label = f"{request.param} test model"
    monkeypatch.setattr(runtime, "select_model", lambda _: (MODELS[request.param](), label))
    with running(env) as client:
        yield client


def settled(client: DBOSClient, refund_id: str) -> str:
    """The refund's status once it is paid, refused, failed, parked for a person or waiting for its customer."""

    def status() -> str | None:
        found = refund_status(client, refund_id)
        return found["status"] if found and found["status"] in _SETTLED else None

    return wait_for(status, timeout=120, what=f"refund {refund_id} to settle")


#: Claims the offline model, naming the right category, does not get paid at once (order, message, amount).
NOT_PAID_AT_ONCE: list[tuple[str, str, str | None]] = [
    ("ord_1001", "My mouse never arrived.", None),  # delivered with a photo: the customer is asked to confirm
    ("ord_1013", "Where is my parcel? It has not arrived.", None),  # in transit: nothing yet
    ("ord_1015", "I returned the yoga mat weeks ago.", None),  # a label never scanned: asked for its tracking number
    ("ord_1017", "I don't recognise this charge.", "90.00"),  # an open dispute: refused
    ("ord_1016", "I was charged twice for this band.", None),  # an early fraud warning: a person
]


def test_a_model_that_files_every_claim_as_damaged_is_paid_nothing_the_right_category_would_not_be(
    env: Env, model_client: DBOSClient
) -> None:
    for n, (order_id, message, amount) in enumerate(NOT_PAID_AT_ONCE):
        asked = {"amount": Decimal(amount)} if amount else {}
        refund_id = submit(model_client, f"whole-case-{n:04d}", order_id, message, **asked)
        assert settled(model_client, refund_id) != "completed", (order_id, message)
        assert env.sandbox.refunds(f"ch_{order_id}") == [], (order_id, message)


def test_an_arrived_damaged_claim_on_a_disputed_charge_is_refused(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "whole-case-1017", "ord_1017", "The running shoes arrived damaged.", amount=Decimal(90))
    outcome = result(client, refund_id)
    assert outcome["status"] == "rejected" and "dispute decides" in outcome["detail"]
    assert env.sandbox.refunds("ch_ord_1017") == []
    assert row(refund_id).evidence["risk"]["disputes"][0]["status"] == "needs_response"


REWORDINGS: list[tuple[str, str]] = [
    ("I didn't get it.", "awaiting_customer"),
    ("Parcel lost, please refund.", "awaiting_customer"),
    ("It never showed up at my door.", "awaiting_customer"),
    ("It arrived broken.", "completed"),
]


@pytest.mark.parametrize(("message", "status"), REWORDINGS, ids=[r[0] for r in REWORDINGS])
def test_never_arrived_however_worded_checks_the_carrier_and_arrived_broken_pays(
    env: Env, client: DBOSClient, message: str, status: str
) -> None:
    """ord_1001 was delivered with a photo at the door: a claim that it never came asks the customer to confirm,
    however it is worded and whether or not the model looked the parcel up; a claim that it came broken is paid."""
    refund_id = submit(client, "whole-case-reword", "ord_1001", message, amount=Decimal(1))
    assert settled(client, refund_id) == status
    assert "evidence.track_shipment" in steps_of(client, refund_id)
    [verdict] = entries(refund_id, "policy_verdict")
    if status == "awaiting_customer":
        assert verdict["question"] == "delivery", verdict
        assert any("delivered" in reason for reason in verdict["reasons"]), verdict
        assert env.sandbox.refunds("ch_ord_1001") == []


def test_a_refund_approved_on_a_charged_back_charge_is_refused_by_the_provider(env: Env, client: DBOSClient) -> None:
    """240.00 USD is above the limit, so nothing reads the charge's risk before a person approves it; the provider
    refuses the charged-back charge (``charge_disputed``) and the refund ends refused, its customer told why."""
    refund_id = submit(client, "whole-case-chargeback", "ord_1017", "Please refund me")
    parked(client, refund_id)
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    outcome = result(client, refund_id)
    assert outcome["status"] == "rejected" and "open dispute" in outcome["detail"], outcome
    assert env.sandbox.refunds("ch_ord_1017") == []
    found: Any = refund_status(client, refund_id)
    assert found is not None and "dispute" in (found.get("customer_message") or {}).get("text", ""), found


def test_a_proposal_must_name_its_category_and_one_recorded_without_reads_as_other() -> None:
    answer = {"amount": "1.00", "currency": "USD", "reason": "r", "customer_reply": "c"}
    with pytest.raises(ValidationError, match="category"):
        RefundProposal.model_validate(answer)
    assert "category" in RefundProposal.model_json_schema()["required"]  # the model is told it must name one
    assert RecordedProposal.model_validate(answer).category == "other"  # a response recorded before categories
