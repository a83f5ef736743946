"""What the services hold for an evaluation case, and the customer's earlier refunds."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from sandbox.evidence_seed import EvidenceSeed, RiskSeed
from steps.records import to_minor


class OrderSpec(Protocol):
    """The part of proving.evals.cases.OrderSpec a case's evidence is seeded from (cases imports this module, so it
    is not imported back)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def email(self) -> str: ...
    @property
    def currency(self) -> str: ...
    @property
    def captured(self) -> Decimal: ...
    @property
    def carrier(self) -> str: ...
    @property
    def tracking(self) -> str: ...


#: A service the harness makes fail for one case's look-ups (answers 500 for its tracking code or order).
FailingService = Literal["carrier", "returns"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EarlierRefund(_Frozen):
    """A refund the customer asked for before (a row of the refunds table the case file's read finds)."""

    order: str
    """One of the case's orders, of the requesting customer."""
    amount: Decimal
    days: float
    """How long ago it was asked for."""
    status: str = "completed"


class CaseEvidence(_Frozen):
    """What the services hold for the case, in the evidence sandbox's seed format. Identifiers left out are the
    requested order's: a tracker's carrier and code, a return's order id, a ticket's requester, a risk signal's
    charge (and a dispute's amount and currency: the order's)."""

    trackers: list[dict[str, Any]] = []
    returns: list[dict[str, Any]] = []
    tickets: list[dict[str, Any]] = []
    early_fraud_warnings: list[dict[str, Any]] = []
    disputes: list[dict[str, Any]] = []
    failing: list[FailingService] = []
    """Services that answer this case's look-ups with errors (the look-up fails through its retries)."""

    def seeds(self, order: OrderSpec) -> tuple[EvidenceSeed, RiskSeed]:
        requester = {"requester_email": order.email, "requester_name": order.name}
        charge = {"charge": f"ch_{order.id}"}
        minor = to_minor(order.captured, order.currency)
        owed = {"amount": minor, "currency": order.currency.lower()}
        evidence = EvidenceSeed.model_validate(
            {
                "trackers": [{"carrier": order.carrier, "tracking_code": order.tracking} | t for t in self.trackers],
                "returns": [{"order_id": order.id, "currency": order.currency} | r for r in self.returns],
                "tickets": [requester | t for t in self.tickets],
            }
        )
        risk = RiskSeed.model_validate(
            {
                "early_fraud_warnings": [charge | w for w in self.early_fraud_warnings],
                "disputes": [charge | owed | d for d in self.disputes],
            }
        )
        return evidence, risk
