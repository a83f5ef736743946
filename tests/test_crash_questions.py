"""Workers killed with SIGKILL at each step of asking the customer and judging their answer, then relaunched: the
question is asked once, the answer recorded once, and the refund paid once (the provider's ledger counts it).

The refund: "it never arrived" on an order the carrier shows delivered with a photo at the door, so policy asks the
customer to confirm; their answer (still not received) is judged again and parks the refund for a person (their word
against the carrier's photo), who approves it through the approvals queue; then it pays. Both databases.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSClient, EnqueueOptions

from agent.approvals import APPROVAL_QUEUE, family
from agent.domain import RefundRequest
from agent.ops.processes import wait_for
from agent.questions import ANSWER_WORKFLOW, answer_id, ids
from agent.status import parked
from agent.submit import submit_refund
from steps import audit
from steps.evidence import CustomerAnswer
from steps.questions import question_of
from steps.store import app_db, outbox
from tests.conftest import Env
from tests.crash_cluster import Cluster
from tests.identities import HELPDESK

ORDER = "ord_1001"  # delivered with a photo at the door
#: Kill point -> whether it fires before the question is asked (in the deciding run) or after the answer.
POINTS = {
    "after_question_recorded": "asking",
    "after_answer_recorded": "answering",
    "after_answer_received": "answering",
    "after_rejudged": "answering",
}


def question_asked(refund_id: str) -> bool:
    with app_db().engine.connect() as conn:
        asked = question_of(conn, refund_id)
        told = conn.execute(sa.select(outbox.c.body).where(outbox.c.message_key == f"{refund_id}:customer:question"))
        return asked is not None and asked.state == "open" and told.first() is not None


def answer(client: DBOSClient, refund_id: str) -> None:
    """The customer's answer, as the link or the help desk hands it over: the answer workflow, on the approvals
    queue (the worker that takes it may be about to die)."""
    given = CustomerAnswer(question="delivery", received=False, text="Still not here.", via="link")
    options: EnqueueOptions = {
        "queue_name": APPROVAL_QUEUE, "workflow_name": ANSWER_WORKFLOW, "workflow_id": answer_id(refund_id),
    }  # fmt: skip
    client.enqueue(options, refund_id, given.model_dump(mode="json"), "link:crash")


def pending(cluster: Cluster, refund_id: str) -> list[str]:
    found = cluster.client.list_workflows(workflow_ids=family(refund_id) + ids(refund_id), load_output=False)
    return sorted(w.workflow_id for w in found if w.status == "PENDING")


@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_while_asking_or_judging_the_answer_then_restart_and_approval_pays_exactly_once(
    env: Env, cluster: Cluster, point: str
) -> None:
    refund_id = f"crash-ask-{point.replace('_', '-')}"
    first = cluster.worker("worker-1", crash_at=point)
    request = RefundRequest(order_id=ORDER, message="My parcel never arrived.")
    submit_refund(cluster.client, idempotency_key=refund_id, requester=HELPDESK, request=request)
    if POINTS[point] == "answering":
        wait_for(lambda: question_asked(refund_id), timeout=90, what="the question")
        answer(cluster.client, refund_id)
    code = wait_for(first.poll, timeout=90, what="the first worker to die")
    assert code == -signal.SIGKILL, cluster.dump_logs()
    assert pending(cluster, refund_id), "the kill left nothing pending"

    cluster.worker("worker-2")
    if POINTS[point] == "asking":
        wait_for(lambda: question_asked(refund_id), timeout=90, what="the question after the restart")
        answer(cluster.client, refund_id)
    wait_for(lambda: parked(cluster.client, refund_id), timeout=90, what="the answer to park the refund")
    assert env.sandbox.refunds(f"ch_{ORDER}") == []  # the answer alone pays nothing
    cluster.approve(refund_id)
    outcome: dict[str, Any] = cluster.finished(refund_id)

    assert outcome["status"] == "completed", cluster.dump_logs()
    ledger = env.sandbox.refunds(f"ch_{ORDER}")
    assert len(ledger) == 1
    assert ledger[0]["metadata"]["idempotency_key"] == f"refund:{refund_id}:{ORDER}"
    assert env.sandbox.stats()["refunds_applied"] == 1
    wait_for(lambda: pending(cluster, refund_id) == [], timeout=60, what="the refund's timers to end")
    with app_db().engine.connect() as conn:
        assert audit.verify(conn).ok
        events = [e.event for e in audit.entries(conn, refund_id)]
        questions = conn.execute(sa.select(outbox.c.message_key).where(outbox.c.refund_id == refund_id)).scalars()
        keys = sorted(questions)
    once = ("customer_asked", "customer_answered", "approval_requested", "approval_decided", "refund_paid")
    assert [events.count(event) for event in once] == [1, 1, 1, 1, 1]
    # Asked once, told once that a person reviews it and once the outcome; the approver asked once.
    assert keys == [
        f"{refund_id}:approvers:request:admin",
        f"{refund_id}:customer",
        f"{refund_id}:customer:question",
        f"{refund_id}:customer:waiting",
    ]
