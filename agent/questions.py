"""A refund's question to its customer: its durable names and ids, the signed answer link, and what is asked.

Policy decides when to ask (agent/evidence_policy.py): only where the customer can close the gap, and once per refund.
The refund then waits as rows, like a parked approval: the question's row, a reminder and a deadline (DELAYED
workflows). An answer, through the link or a comment on the refund's help-desk ticket, runs the answer workflow
(``{refund_id}/answer``), which records it once and starts the second judgement (``{refund_id}/rejudge``).
"""

from __future__ import annotations

from datetime import datetime

from agent import tokens
from steps.evidence import QUESTION_KINDS, QuestionKind

# Durable names: workflows recorded in the system database; never rename them.
ANSWER_WORKFLOW = "customer_answer_workflow"
REJUDGE_WORKFLOW = "customer_rejudge_workflow"
REMINDER_WORKFLOW = "customer_question_reminder_workflow"
EXPIRY_WORKFLOW = "customer_question_expiry_workflow"
LEAD_WORKFLOW = "customer_wait_lead_workflow"
QUESTION_TIMERS = [EXPIRY_WORKFLOW, REMINDER_WORKFLOW]
#: Durable: the patch recorded by refunds that asked their customer (refunds decided before it replay as recorded).
ASK_CUSTOMER_PATCH = "ask-customer"
EXPIRED_DETAIL = "question expired: the customer did not answer before the deadline"
#: Why a refund a support lead took out of its customer's wait reads as it does.
ENDED_DETAIL = "the wait for the customer's answer was ended by {operator}"
TO_PERSON_REASON = "{operator} sent it to a person before the customer answered"
#: The largest file an answer link takes, and the image types it keeps (read from the bytes, not the name).
MAX_FILE_BYTES = 5 * 1024 * 1024

__all__ = ["QUESTION_KINDS", "QuestionKind"]


def answer_id(refund_id: str) -> str:
    return f"{refund_id}/answer"


def rejudge_id(refund_id: str) -> str:
    return f"{refund_id}/rejudge"


def reminder_id(refund_id: str) -> str:
    return f"{refund_id}/answer-reminder"


def expiry_id(refund_id: str) -> str:
    return f"{refund_id}/answer-deadline"


def lead_id(refund_id: str) -> str:
    """A support lead's move on the wait: one per refund, so a second move meets the first's result."""
    return f"{refund_id}/answer-lead"


def ids(refund_id: str) -> list[str]:
    """Every workflow id a refund's question can have."""
    return [
        answer_id(refund_id),
        rejudge_id(refund_id),
        reminder_id(refund_id),
        expiry_id(refund_id),
        lead_id(refund_id),
    ]


def answer_link(public_url: str, secret: bytes, refund_id: str, question: str, expires_at: datetime) -> str:
    """The customer's link to answer (pure: the same on every replay); it expires with the question."""
    claims = tokens.AnswerClaims(refund_id=refund_id, question=question, expires_at=expires_at)
    return f"{public_url.rstrip('/')}/answer/{refund_id}/{tokens.sign_answer(claims, secret)}"


_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def image_type(content: bytes) -> str | None:
    """The image type the bytes are (JPEG, PNG, GIF, WebP), whatever name or type they were sent with; None for
    anything else (HTML, scripts, SVG, archives...)."""
    for signature, kind in _SIGNATURES:
        if content.startswith(signature):
            return kind
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    return None
