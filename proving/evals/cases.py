"""The evaluation dataset: refund requests with their own orders and the outcome a correct agent reaches."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_evals import Case, Dataset

from agent import policy
from agent.domain import ClaimCategory, RefundRequest, VerdictKind
from proving.evals.case_evidence import CaseEvidence, EarlierRefund
from steps.evidence import QUESTION_KINDS, AnswerFile, CustomerAnswer, QuestionKind
from steps.records import Order, OrderStatus, quantize, supported

#: The look-up tools a case may expect (agent/brain.py's EVIDENCE_TOOLS).
LookUpTool = Literal["track_shipment", "check_return", "check_payment_risk", "read_earlier_tickets"]
LOOK_UP_TOOLS: tuple[str, ...] = ("track_shipment", "check_return", "check_payment_risk", "read_earlier_tickets")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OrderSpec(_Frozen):
    """One order row (and its customer) written into the run's throwaway database."""

    id: str
    customer: str
    name: str
    currency: str
    captured: Decimal
    refunded: Decimal = Decimal(0)
    status: OrderStatus = "paid"
    days: int | None
    """Days since payment; None when the order was never paid."""
    items: list[str]
    notes: str = ""
    carrier: str = ""
    tracking: str = ""
    """The shipment's tracking code at ``carrier``; empty when the order was never shipped."""

    @property
    def email(self) -> str:
        return f"{self.customer}@example.com"

    @field_validator("currency")
    @classmethod
    def _known(cls, value: str) -> str:
        if not supported(value):
            raise ValueError(f"unsupported currency {value}")
        return value

    def order(self, now: datetime) -> Order:
        return Order(
            order_id=self.id,
            customer_id=self.customer,
            customer_name=self.name,
            currency=self.currency,
            amount_captured=self.captured,
            amount_refunded=self.refunded,
            status=self.status,
            paid_at=None if self.days is None else now - timedelta(days=self.days),
            charge_id=f"ch_{self.id}",
            items=list(self.items),
            notes=self.notes,
            customer_email=self.email,
            carrier=self.carrier,
            tracking_code=self.tracking,
        )


class RequestSpec(_Frozen):
    message: str
    order: str | None = None
    """The order the request names; the case's first order when omitted."""
    amount: Decimal | None = None
    currency: str | None = None


class Outcome(_Frozen):
    """A verdict and what it pays ("0" for refuse and for ask_customer: nothing is paid, or not yet); with
    ask_customer, the question asked."""

    verdict: VerdictKind
    amount: Decimal
    question: QuestionKind | None = None

    @model_validator(mode="after")
    def _refuse_pays_nothing(self) -> Outcome:
        if (self.verdict in ("refuse", "ask_customer")) != (self.amount == 0):
            raise ValueError("refuse and ask_customer pay 0, and only they pay 0")
        if (self.verdict == "ask_customer") != (self.question is not None):
            raise ValueError("ask_customer names its question, and only it does")
        return self


class AnswerSpec(_Frozen):
    """The customer's answer to the refund's question, as the answer link or a ticket comment brings it."""

    text: str = ""
    received: bool | None = None
    """The link's choice for ``delivery`` (False: still not received; True: it arrived); None: only their words."""
    tracking_number: str = ""
    photos: int = 0
    """Images sent (JPEG, 48 kB each, as an upload is described); 0: none."""

    def answer(self, question: QuestionKind) -> CustomerAnswer:
        files = [
            AnswerFile(name=f"photo-{n}.jpg", content_type="image/jpeg", size=48_213, sha256=f"{n:064x}", stored=True)
            for n in range(1, self.photos + 1)
        ]
        return CustomerAnswer(
            question=question, text=self.text, received=self.received, tracking_number=self.tracking_number,
            files=files, via="link",
        )  # fmt: skip


class EvalCase(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9-]{3,60}$")
    category: str
    note: str = ""
    orders: list[OrderSpec] = Field(min_length=1)
    request: RequestSpec
    expected: Outcome
    acceptable: list[Outcome] = []
    """Other outcomes that are also correct (e.g. refusing an adversarial request outright)."""
    must_not_say: list[str] = []
    expected_tools: list[LookUpTool]
    """The look-ups a correct agent makes for this request (none for a plain request)."""
    claim: ClaimCategory
    """What the customer really claims, labelled by hand on every case: the category evaluator's answer, and what
    the evidence rules are restated for (whatever category the agent read)."""
    evidence: CaseEvidence = CaseEvidence()
    earlier_refunds: list[EarlierRefund] = []
    answer: AnswerSpec | None = None
    """With an expected ask_customer: the customer's answer, which the run plays as the refund's second judgement."""
    then: Outcome | None = None
    """The outcome once the refund is judged again with ``answer`` (a refund asks once: never ask_customer)."""

    @property
    def order_id(self) -> str:
        return self.request.order or self.orders[0].id

    @property
    def order(self) -> OrderSpec:
        return next(o for o in self.orders if o.id == self.order_id)

    def refund_request(self) -> RefundRequest:
        r = self.request
        return RefundRequest(order_id=self.order_id, message=r.message, amount=r.amount, currency=r.currency)

    def accepted(self) -> list[Outcome]:
        return [self.expected, *self.acceptable]

    @model_validator(mode="after")
    def _answered(self) -> EvalCase:
        asks = any(o.verdict == "ask_customer" for o in self.accepted())
        if asks != (self.answer is not None) or (self.answer is None) != (self.then is None):
            raise ValueError(f"{self.name}: a case that expects a question has its answer and the outcome after it")
        if self.then is not None and self.then.verdict == "ask_customer":
            raise ValueError(f"{self.name}: a refund asks once; after the answer it pays, goes to a person or refuses")
        return self


class LimitsSpec(_Frozen):
    auto_approve: Decimal
    absolute_cap: Decimal
    window_days: int
    customer_window_days: int = 30
    customer_max_refunds: int = 3
    customer_max_amount: Decimal = Decimal("500.00")
    questions: list[QuestionKind] = list(QUESTION_KINDS)
    """What a refund may ask its customer (``CUSTOMER_QUESTIONS``; all by default, as the service)."""

    def limits(self) -> policy.Limits:
        return policy.Limits(
            auto_approve=self.auto_approve,
            absolute_cap=self.absolute_cap,
            window_days=self.window_days,
            customer_window_days=self.customer_window_days,
            customer_max_refunds=self.customer_max_refunds,
            customer_max_amount=self.customer_max_amount,
            questions=frozenset(self.questions),
        )


class DatasetFile(_Frozen):
    name: str
    limits: LimitsSpec
    cases: list[EvalCase] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> DatasetFile:
        names = Counter(c.name for c in self.cases)
        orders = Counter(o.id for c in self.cases for o in c.orders)
        if dupes := [n for n, k in (names + orders).items() if k > 1]:
            raise ValueError(f"case names and order ids must be unique: {dupes}")
        customers: dict[str, str] = {}
        codes = Counter(o.tracking for c in self.cases for o in c.orders if o.tracking)
        if dupes := [code for code, k in codes.items() if k > 1]:
            raise ValueError(f"tracking codes must be unique: {dupes}")
        for case in self.cases:
            case.refund_request()  # the request itself must be valid
            case.evidence.seeds(case.order)  # and what the services hold is in their seed format
            own = {o.id: o.customer for o in case.orders}
            if any(own.get(r.order) != case.order.customer for r in case.earlier_refunds):
                raise ValueError(f"{case.name}: earlier refunds are on the requesting customer's own orders")
            if case.order_id not in {o.id for o in case.orders}:
                raise ValueError(f"{case.name}: the request names an order the case does not define")
            for o in case.orders:
                if customers.setdefault(o.customer, o.name) != o.name:
                    raise ValueError(f"{case.name}: customer {o.customer} has two names")
                if (o.status == "unpaid") != (o.days is None):
                    raise ValueError(f"{case.name}: paid or disputed orders have days since payment, unpaid none")
            for outcome in case.accepted():
                if outcome.amount != quantize(outcome.amount, case.order.currency):
                    raise ValueError(f"{case.name}: expected amount is not in {case.order.currency} minor units")
        return self


class CaseMeta(_Frozen):
    category: str
    note: str = ""
    expected_tools: list[str] = []


DEFAULT_DATASET = "dataset.yaml"


def dataset_text(path: Path | None = None) -> str:
    if path is not None:
        return path.read_text(encoding="utf-8")
    return resources.files("proving.evals").joinpath(DEFAULT_DATASET).read_text(encoding="utf-8")


def load_dataset_file(path: Path | None = None) -> tuple[DatasetFile, str]:
    """The dataset and the SHA-256 of its text (reports name it, so runs on other data are told apart)."""
    text = dataset_text(path)
    # libyaml's safe loader (in PyYAML's wheels) reads the dataset in ~50 ms; the pure-Python one takes ~400.
    raw: Any = yaml.load(text, Loader=yaml.CSafeLoader) if yaml.__with_libyaml__ else yaml.safe_load(text)
    return DatasetFile.model_validate(raw), hashlib.sha256(text.encode()).hexdigest()


def eval_dataset(
    data: DatasetFile, evaluators: list[Any], *, only: list[str] | None = None
) -> Dataset[EvalCase, Any, CaseMeta]:
    """The pydantic-evals Dataset: one Case per entry, the expected outcome as its expected output."""
    cases = [c for c in data.cases if not only or any(s in c.name or s == c.category for s in only)]
    return Dataset[EvalCase, Any, CaseMeta](
        name=data.name,
        cases=[
            Case(
                name=c.name,
                inputs=c,
                expected_output=c.expected,
                metadata=CaseMeta(category=c.category, note=c.note, expected_tools=list(c.expected_tools)),
            )
            for c in cases
        ],
        evaluators=evaluators,
    )
