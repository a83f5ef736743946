"""The real model path: an OpenAIChatModel talking HTTP to a local OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

from pydantic_ai.models import override_allow_model_requests

from agent import runtime
from agent.domain import RefundRequest
from agent.submit import submit_refund
from steps.seed import seed
from steps.store import app_db
from tests.conftest import Env
from tests.fake_openai import FakeOpenAIServer, ScriptedModel


def run_refund(env: Env, model: ScriptedModel, order_id: str, key: str) -> tuple[dict[str, Any], runtime.Runtime]:
    with FakeOpenAIServer(model) as llm, override_allow_model_requests(True):
        rt = runtime.start(env.settings(refund_agent_model="scripted", refund_agent_model_base_url=llm.base_url))
        client = runtime.client(rt.settings)
        try:
            seed(app_db().engine)
            request = RefundRequest(order_id=order_id, message="Please refund my order.")
            submit_refund(client, idempotency_key=key, request=request, app_version="0.1.0")
            outcome: dict[str, Any] = client.retrieve_workflow(key).get_result(polling_interval_sec=0.1)
            return outcome, rt
        finally:
            client.destroy()
            runtime.stop()


def test_agent_completes_a_refund_over_http_tool_calls(env: Env) -> None:
    model = ScriptedModel()
    outcome, _ = run_refund(env, model, "ord_1001", "real-model-0001")
    assert outcome["status"] == "completed"
    assert outcome["model"].startswith("scripted at http://127.0.0.1")
    assert model.requests["ord_1001"] == 4
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_model_that_asks_for_too_much_is_stopped_by_policy(env: Env) -> None:
    greedy = ScriptedModel(amount="10000.00")  # at the absolute cap, far above the order's 42.00
    outcome, _ = run_refund(env, greedy, "ord_1001", "real-model-greedy")
    assert outcome["status"] == "rejected"
    assert "amount 10000.00 exceeds the refundable 42.00 USD" in outcome["detail"]
    assert "cap" not in outcome["detail"]
    assert env.sandbox.refunds() == []


def test_a_model_that_asks_for_more_than_the_cap_is_stopped_by_the_cap(env: Env) -> None:
    greedy = ScriptedModel(amount="10000.01")
    outcome, _ = run_refund(env, greedy, "ord_1001", "real-model-greedier")
    assert outcome["status"] == "rejected"
    assert "amount 10000.01 is above the absolute cap of 10000.00 USD" in outcome["detail"]
    assert env.sandbox.refunds() == []


def test_a_model_server_that_stays_down_fails_the_refund_without_paying(env: Env) -> None:
    down = ScriptedModel(broken=True)
    outcome, _ = run_refund(env, down, "ord_1001", "real-model-down")
    assert outcome["status"] == "failed" and "could not decide" in outcome["detail"]
    assert down.requests["broken"] >= 1
    assert env.sandbox.refunds() == []
