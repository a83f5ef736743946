"""What a refund may ask its customer (agent/questions.py), and how long it waits for the answer."""

from __future__ import annotations

from pydantic import Field, field_validator

from agent.settings.part import Part
from steps.evidence import QUESTION_KINDS


class CustomerQuestionSettings(Part):
    """Questions to customers: asked where only the customer can close a gap in the evidence, answered through a
    signed link or the refund's help-desk ticket."""

    kinds: str = Field(default=",".join(QUESTION_KINDS), alias="customer_questions")
    """Which questions a refund may ask, comma-separated: ``delivery`` (confirm a parcel the carrier shows delivered
    with a photo never came), ``photo`` (of goods claimed broken or wrong while the carrier still shows the parcel
    moving), ``return_tracking`` (the tracking number of a return the warehouse has not seen). All three by default;
    empty: nothing is asked, and such a refund goes to a person or is refused for now as before."""
    reminder_after_seconds: float = Field(default=2 * 86400, gt=0, alias="customer_reminder_after_seconds")
    """After this long without an answer, the customer gets one reminder."""
    answer_timeout_seconds: float = Field(default=5 * 86400, gt=0, alias="customer_answer_timeout_seconds")
    """After this long without an answer, the question expires: the refund is closed unpaid and the customer told
    why. The answer link expires with it."""

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: str) -> str:
        kinds = [k.strip() for k in value.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(QUESTION_KINDS))
        if unknown:
            raise ValueError(f"unknown question kind(s) {', '.join(unknown)}; known: {', '.join(QUESTION_KINDS)}")
        return ",".join(kinds)

    @property
    def enabled(self) -> frozenset[str]:
        return frozenset(k for k in self.kinds.split(",") if k)
