"""A refund refused, rejected, expired or failed at any point never tells its customer it is being reviewed; what
was sent is what GET /refunds/{id} and the console show (real workflows, the offline model)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from dbos import DBOSClient

from agent import approvals, replies
from agent.approval_workflows import decide_here
from agent.console.data import refund_detail
from agent.ops.processes import wait_for
from agent.status import FINAL, refund_status
from steps.store import app_db, orders, outbox
from tests.conftest import Env
from tests.identities import DANA
from tests.test_replies import REVIEWING
from tests.test_workflow import parked, result, running, submit


def emails(refund_id: str, *, key: str | None = None) -> list[str]:
    """What the refund's customer was sent (the outbox's email channel), in order; with ``key``, that one only."""
    with app_db().engine.connect() as conn:
        query = sa.select(outbox.c.body).where(outbox.c.refund_id == refund_id, outbox.c.channel == "email")
        if key is not None:
            query = query.where(outbox.c.message_key == key)
        return [str(body) for body in conn.execute(query.order_by(outbox.c.id)).scalars()]


def told(client: DBOSClient, refund_id: str) -> str:
    """The refund's one message about its outcome, once it has ended; the API shows that same message."""
    outcome = result(client, refund_id)
    assert outcome["status"] in FINAL
    key = f"{refund_id}:customer"
    [sent] = wait_for(lambda: emails(refund_id, key=key) or None, timeout=30, what=f"the message of {refund_id}")
    shown = refund_status(client, refund_id)
    assert shown is not None and shown["customer_message"]["text"] == sent and shown["customer_message"]["sent_at"]
    assert shown["customer_message"]["about"] == "outcome"
    assert shown["customer_message"]["delivery"] == "pending"  # no SMTP server here: it stays in the outbox
    return sent


def told_to_wait(client: DBOSClient, refund_id: str) -> str:
    """The message a parked refund's customer was sent: a person must confirm it, and by when they hear again."""
    waiting = refund_status(client, refund_id)
    assert waiting is not None and waiting["customer_message"] is not None
    assert waiting["customer_message"]["about"] == "waiting"
    [sent] = emails(refund_id)  # the only one while it waits
    assert waiting["customer_message"]["text"] == sent
    request = waiting["approval"]["request"]  # by when: the approval's deadline (the wording: test_replies.py)
    expires = datetime.fromisoformat(request["expires_at"])
    assert sent == replies.waiting(Decimal(request["amount"]), request["currency"], expires)
    return sent


def test_a_refund_above_the_cap_tells_the_customer_why_not_that_it_is_reviewed(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-cap-000001", "ord_1007", "Refund the bike please.")
    sent = told(client, refund_id)
    assert result(client, refund_id)["status"] == "rejected"
    assert not REVIEWING.search(sent)
    assert "12,000.00 USD" in sent and "more than we can refund for a single request" in sent
    shown = refund_status(client, refund_id)
    assert shown is not None and "review" in (shown["customer_reply"] or "")  # the model's draft, never sent
    page = refund_detail(client, refund_id)
    assert page is not None and page["customer_message"]["text"] == sent  # the console shows what was sent


def test_an_order_gone_before_paying_is_told_the_order_was_not_found(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-missing-01", "ord_1002")
    parked(client, refund_id)
    with app_db().engine.begin() as conn:  # an order removed while a person decides (submission checks it exists)
        conn.execute(orders.delete().where(orders.c.order_id == "ord_1002"))
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    sent = told(client, refund_id)
    assert result(client, refund_id)["status"] == "failed"
    assert "could not find this order" in sent and not REVIEWING.search(sent)


def test_an_open_dispute_tells_the_customer_the_dispute_decides(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-dispute-01", "ord_1017", "I don't recognise this charge.")
    sent = told(client, refund_id)
    assert "dispute" in sent and not REVIEWING.search(sent)
    assert "0.00" not in sent  # nothing is refundable: the message names no amount rather than 0.00


def test_a_refusal_of_the_disputed_order_names_the_amount_asked_never_0_00(env: Env, client: DBOSClient) -> None:
    """ord_1004's charge is disputed, so nothing is refundable: the customer reads the amount they asked for."""
    asked = submit(client, "told-disputed-asked", "ord_1004", "Refund the headphones.", amount=Decimal("60.00"))
    sent = told(client, asked)
    assert "we cannot refund 60.00 USD on this order because a dispute about this payment is open" in sent
    assert "0.00 USD" not in sent.replace("60.00 USD", "")
    named_none = submit(client, "told-disputed-none", "ord_1004", "Refund the headphones.")
    sent = told(client, named_none)
    assert "we cannot refund anything on this order because a dispute" in sent and "0.00" not in sent


def test_a_parked_refund_tells_the_customer_by_when_then_a_person_s_no_is_told_plainly(
    env: Env, client: DBOSClient
) -> None:
    refund_id = submit(client, "told-reject-001", "ord_1002", "Everything arrived broken.")
    parked(client, refund_id)
    waiting = told_to_wait(client, refund_id)
    assert "4,200.00 USD" in waiting and "cannot refund" not in waiting
    page = refund_detail(client, refund_id)
    assert page is not None and page["customer_message"]["text"] == waiting
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="reject", approver=DANA, via="console")
    sent = told(client, refund_id)
    assert "decided not to refund 4,200.00 USD" in sent and not REVIEWING.search(sent)
    assert emails(refund_id) == [waiting, sent]  # the waiting notice, then the outcome: nothing else


def test_a_re_check_that_refuses_before_paying_is_told_plainly(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-recheck-01", "ord_1002")
    parked(client, refund_id)
    with app_db().engine.begin() as conn:
        conn.execute(orders.update().where(orders.c.order_id == "ord_1002").values(amount_refunded_minor=420000))
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    sent = told(client, refund_id)
    assert "re-check before paying" in result(client, refund_id)["detail"]
    assert "already been refunded in full" in sent and not REVIEWING.search(sent)


def test_an_approved_refund_is_told_what_was_paid(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-approve-01", "ord_1002")
    parked(client, refund_id)
    approvals.decide_pending(decide_here, refund_id=refund_id, decision="approve", approver=DANA, via="console")
    sent = told(client, refund_id)
    assert "Your refund of 4,200.00 USD has been approved and sent" in sent and "business days" in sent


def test_an_expired_approval_tells_the_customer_no_one_confirmed_it_in_time(env: Env) -> None:
    with running(env, approval_escalate_after_seconds=0.5, approval_timeout_seconds=1.5) as client:
        refund_id = submit(client, "told-expired-01", "ord_1009")
        sent = told(client, refund_id)
        assert "could not confirm your refund" in sent and not REVIEWING.search(sent)
        [waiting, outcome] = emails(refund_id)  # told by when, then told at that time that it expired
        assert "you will hear from us again by" in waiting and outcome == sent


@pytest.fixture
def rechecking(env: Env) -> Iterator[DBOSClient]:
    with running(env, payment_recheck_seconds=0.5) as client:
        yield client


def test_a_refund_the_provider_fails_later_sends_the_customer_nothing(env: Env, rechecking: DBOSClient) -> None:
    env.sandbox.set_faults(pending_fail_next=1, settle_after_ms=300)
    refund_id = submit(rechecking, "told-provider-1", "ord_1001")
    outcome: dict[str, Any] = result(rechecking, refund_id)
    assert outcome["status"] == "failed"
    assert emails(refund_id) == []  # operators are alerted; the customer is never told it was paid or reviewed
    shown = refund_status(rechecking, refund_id)
    assert shown is not None and shown["customer_message"] is None


def test_a_small_refund_paid_at_once_sends_the_models_draft_when_it_fits(env: Env, client: DBOSClient) -> None:
    refund_id = submit(client, "told-paid-00001", "ord_1001", "The mouse stopped working.")
    sent = told(client, refund_id)
    shown = refund_status(client, refund_id)
    assert shown is not None and sent == shown["customer_reply"]  # the offline model's draft names 42.00 USD
    assert "42.00" in sent and not REVIEWING.search(sent) and Decimal("42.00") == Decimal(shown["amount"])
