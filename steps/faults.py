"""Named crash points, armed by the runtime from settings, used by the crash tests and the demo."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

CRASH_POINTS = frozenset(
    {
        "after_model_response",  # the model's answer is checkpointed; policy is about to judge it
        "before_provider_call",  # inside the payment step, before the refund is sent
        "after_provider_call",  # the provider applied the refund; the step has not checkpointed
        "after_decision_recorded",  # the decision workflow recorded the decision; the continuation does not exist
        "after_continuation_enqueued",  # the continuation is enqueued; the decision has not been sent to it
        "after_decision_sent",  # the decision was sent; the decision workflow has not finished
        "after_approval_received",  # the continuation received the decision; nothing after it has run
        "after_payment_parked",  # the provider's refund is pending and recorded; no re-read is scheduled yet
        "after_payment_settled",  # the provider's final answer is booked; the settling workflow has not ended
        "after_carrier_answered",  # the carrier's tracking answered; the look-up step has not checkpointed
        "after_warehouse_answered",  # the warehouse's return answered; the look-up step has not checkpointed
        "after_email_sent",  # the SMTP server accepted an outbox message; its row is not recorded sent yet
        "after_ticket_comment_posted",  # the help desk took an outbox message as a comment; not recorded sent yet
        "after_question_recorded",  # the question and the verdict are recorded; no timer, no message to the customer
        "after_answer_recorded",  # the answer is recorded; the second judgement is not enqueued
        "after_answer_received",  # the second judgement read the answer; nothing after it has run
        "after_rejudged",  # the second judgement decided; nothing is recorded or paid yet
    }
)

_armed: set[str] = set()


def arm(point: str | None) -> None:
    _armed.clear()
    if point:
        if point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; known: {sorted(CRASH_POINTS)}")
        _armed.add(point)


def crash_point(point: str) -> None:
    """SIGKILL this process here when the point is armed: no cleanup, no checkpoint, like a power cut."""
    if point in _armed:
        log.warning("crash point %s reached: killing process %d", point, os.getpid())
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
