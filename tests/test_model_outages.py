"""A model that fails, times out or rate-limits on loopback: the refund is retried, falls back, or goes to a person
with the reason; it never ends FAILED for a provider blip, and it is never paid twice."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOS, WorkflowHandle
from pydantic_ai.exceptions import (
    FallbackExceptionGroup,
    ModelConnectionError,
    ModelHTTPError,
    RunCancelled,
    UnexpectedModelBehavior,
)
from pydantic_ai.models import override_allow_model_requests

from agent import model_calls, runtime
from agent.approvals import pending_request
from agent.domain import RefundRequest
from agent.model_calls import from_the_model, transient
from agent.submit import submit_refund
from sandbox.model import FakeOpenAIServer, Fault, ScriptedModel
from steps.seed import seed
from steps.store import app_db, outbox, refunds
from tests.conftest import Env
from tests.identities import HELPDESK

#: Fast retries, so a test waits tenths of a second between attempts rather than seconds.
QUICK = {"refund_agent_model_attempts": 3, "refund_agent_model_retry_interval_seconds": 0.05}


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ModelHTTPError(500, "m"), True),
        (ModelHTTPError(503, "m"), True),
        (ModelHTTPError(429, "m"), True),
        (ModelHTTPError(408, "m"), True),
        (ModelConnectionError("m", "connection reset"), True),
        (TimeoutError(), True),
        (ModelHTTPError(400, "m"), False),
        (ModelHTTPError(401, "m"), False),
        (ModelHTTPError(404, "m"), False),
        (UnexpectedModelBehavior("no valid answer"), False),
        (FallbackExceptionGroup("all failed", [ModelHTTPError(401, "a"), ModelHTTPError(502, "b")]), True),
        (FallbackExceptionGroup("all failed", [ModelHTTPError(401, "a"), ModelHTTPError(400, "b")]), False),
    ],
)
def test_only_transient_model_errors_are_retried(error: Exception, retried: bool) -> None:
    assert transient(error) is retried
    assert from_the_model(error)  # retried or not, the refund goes to a person when it is the model's failure


def test_a_cancelled_run_or_a_bug_is_not_the_models_failure() -> None:
    assert not from_the_model(RunCancelled("cancelled"))
    assert not from_the_model(KeyError("case"))


def decide(
    env: Env,
    model: ScriptedModel,
    key: str,
    *,
    fallback: ScriptedModel | None = None,
    order_id: str = "ord_1001",
    message: str = "The mouse stopped working.",
    **overrides: Any,
) -> dict[str, Any]:
    """Run one refund of ``order_id`` against ``model`` (and ``fallback``) over HTTP; its outcome and records."""
    with ExitStack() as stack:
        llm = stack.enter_context(FakeOpenAIServer(model))
        values: dict[str, Any] = {
            **QUICK,
            "refund_agent_model": "scripted",
            "refund_agent_model_base_url": llm.base_url,
        }
        if fallback is not None:
            backup = stack.enter_context(FakeOpenAIServer(fallback))
            values.update(refund_agent_model_fallback="backup", refund_agent_model_fallback_base_url=backup.base_url)
        stack.enter_context(override_allow_model_requests(True))
        rt = runtime.start(env.settings(**{**values, **overrides}), freeze_heap=False)
        client = runtime.client(rt.settings)
        try:
            seed(app_db().engine)
            request = RefundRequest(order_id=order_id, message=message)
            submit_refund(client, idempotency_key=key, requester=HELPDESK, request=request, app_version="0.1.0")
            outcome: dict[str, Any] = client.retrieve_workflow(key).get_result(polling_interval_sec=0.1)
            outcome["model_label"] = rt.model_label
            outcome["approval_request"] = pending_request(key)
            with app_db().engine.connect() as conn:
                outcome["row_status"] = conn.execute(
                    sa.select(refunds.c.status).where(refunds.c.refund_id == key)
                ).scalar_one()
                outcome["customer_told"] = [
                    str(body)
                    for body in conn.execute(sa.select(outbox.c.body).where(outbox.c.refund_id == key)).scalars()
                ]
            return outcome
        finally:
            client.destroy()
            runtime.stop()


def test_a_model_server_error_is_retried_and_the_refund_paid_once(env: Env) -> None:
    model = ScriptedModel(faults=[Fault(500)])
    outcome = decide(env, model, "outage-500-then-ok")
    assert outcome["status"] == "completed", outcome
    assert (model.requests["failed"], model.requests["ord_1001"]) == (1, 1)  # one 500, then one answer
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_rate_limited_model_request_is_retried_after_the_wait_the_server_asked_for(env: Env) -> None:
    """The server says Retry-After: 1 and refuses whoever comes back sooner; the retry interval alone (0.05 s,
    0.1 s) would come back too early every time."""
    model = ScriptedModel(faults=[Fault(429, retry_after=1)])
    outcome = decide(env, model, "outage-429-retry-after")
    assert outcome["status"] == "completed", outcome
    assert model.requests["too_early"] == 0
    assert (model.requests["failed"], model.requests["ord_1001"]) == (1, 1)
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_model_request_slower_than_the_timeout_is_abandoned_and_retried(env: Env) -> None:
    model = ScriptedModel(faults=[Fault(200, delay_s=5)])  # answers, but only after 5 s
    outcome = decide(env, model, "outage-timeout", refund_agent_model_timeout_seconds=0.5)
    assert outcome["status"] == "completed", outcome
    assert model.arrived == 2  # the slow request was given up on and sent again
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_model_that_stays_down_sends_the_refund_to_a_person_with_the_reason(env: Env) -> None:
    down = ScriptedModel(broken=True)
    outcome = decide(env, down, "outage-down-person")
    assert outcome["status"] == "awaiting_approval", outcome
    assert outcome["row_status"] == "awaiting_approval"
    assert down.requests["broken"] == 3  # every attempt, then no more
    reason = outcome["approval_request"]["reason"]
    assert "the model was unavailable: ModelServerError (HTTP 500) after 3 attempts" in reason
    assert (outcome["approval_request"]["amount"], outcome["approval_request"]["currency"]) == ("42.00", "USD")
    assert any("A member of our team needs to confirm it" in body for body in outcome["customer_told"])
    assert env.sandbox.refunds() == []


def test_a_refund_policy_refuses_on_the_orders_facts_is_refused_while_the_model_is_down(env: Env) -> None:
    """ord_1004's charge is disputed: nothing is refundable whatever the model would say, so no person is asked."""
    down = ScriptedModel(broken=True)
    outcome = decide(env, down, "outage-disputed", order_id="ord_1004")
    assert outcome["status"] == "rejected", outcome
    assert outcome["row_status"] == "rejected" and outcome["approval_request"] is None
    assert env.sandbox.refunds() == []


def test_a_model_request_the_provider_refuses_is_not_retried_and_goes_to_a_person(env: Env) -> None:
    wrong_key = ScriptedModel(broken=True, broken_status=401)
    outcome = decide(env, wrong_key, "outage-401-person")
    assert outcome["status"] == "awaiting_approval", outcome
    assert wrong_key.requests["broken"] == 1  # a refused request is not sent again
    assert "ModelAuthenticationError (HTTP 401)" in outcome["approval_request"]["reason"]
    assert env.sandbox.refunds() == []


def test_the_fallback_model_decides_when_the_first_is_down(env: Env) -> None:
    down, backup = ScriptedModel(broken=True), ScriptedModel()
    outcome = decide(env, down, "outage-fallback", fallback=backup)
    assert outcome["status"] == "completed", outcome
    assert "(fallback: backup at http://127.0.0.1" in outcome["model_label"]
    assert (down.requests["broken"], backup.requests["ord_1001"]) == (1, 1)  # both tried in the first attempt
    assert len(env.sandbox.refunds("ch_ord_1001")) == 1


def test_a_refund_past_its_model_usage_limit_goes_to_a_person(env: Env) -> None:
    """A claim that needs evidence takes two model requests; the limit allows one."""
    model = ScriptedModel()
    outcome = decide(env, model, "outage-usage-limit", message="My parcel never arrived.",
                     refund_agent_model_request_limit=1)  # fmt: skip
    assert outcome["status"] == "awaiting_approval", outcome
    assert model.requests["ord_1001"] == 1
    assert "the model reached this refund's usage limit" in outcome["approval_request"]["reason"]
    assert env.sandbox.refunds() == []


def test_a_refund_a_release_without_the_person_path_failed_replays_as_it_was_recorded(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refund that a release without this path ended FAILED (the model down) meets the same steps again when it
    is replayed (the patch is not taken), instead of failing on an approval step it never recorded."""
    with FakeOpenAIServer(ScriptedModel(broken=True)) as llm, override_allow_model_requests(True):
        rt = runtime.start(
            env.settings(**QUICK, refund_agent_model="down", refund_agent_model_base_url=llm.base_url),
            freeze_heap=False,
        )
        client = runtime.client(rt.settings)
        try:
            seed(app_db().engine)
            monkeypatch.setattr(model_calls, "from_the_model", lambda _error: False)  # the release before
            request = RefundRequest(order_id="ord_1001", message="The mouse stopped working.")
            submit_refund(client, idempotency_key="outage-old-release", requester=HELPDESK, request=request)
            handle: WorkflowHandle[dict[str, Any]] = client.retrieve_workflow("outage-old-release")
            recorded_run: dict[str, Any] = handle.get_result(polling_interval_sec=0.1)
            assert recorded_run["status"] == "failed"
            monkeypatch.undo()  # this release, replaying every step the old one recorded
            steps = [s["function_name"] for s in client.list_workflow_steps("outage-old-release")]
            replay = DBOS.fork_workflow("outage-old-release", start_step=len(steps) + 1)
            assert replay.get_result() == recorded_run
            replayed = [s["function_name"] for s in client.list_workflow_steps(replay.get_workflow_id())]
            assert pending_request("outage-old-release") is None
        finally:
            client.destroy()
            runtime.stop()
    assert replayed == steps and "refunds.record_outcome" in steps
