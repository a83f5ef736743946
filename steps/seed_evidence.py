"""The demo's evidence: what the carrier, the warehouse, the helpdesk and the payment provider hold about the
demo orders of steps/seed.py (same tracking codes, items, amounts and customers' emails).

Plain data in the sandbox's seed format (``sandbox/evidence_seed.py``: ``EvidenceSeed`` and ``RiskSeed``);
``steps`` and ``sandbox`` do not import each other, so the command that starts a sandbox validates it.
Times are offsets from now in days (negative: the past), so they agree with orders seeded ``days`` ago.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from steps.records import to_minor
from steps.seed import CUSTOMERS, ORDERS, SHIPMENTS, charge_id

_PAID_DAYS_AGO = {order_id: days for order_id, _c, _cur, _cap, _ref, _st, days, *_rest in ORDERS}
_EMAIL = {customer_id: email for customer_id, _name, email in CUSTOMERS}
_NAME = {customer_id: name for customer_id, name, _email in CUSTOMERS}

_CITIES = {
    "USPS": ("Chicago", "IL", "US", "60601"),
    "UPS": ("Louisville", "KY", "US", "40201"),
    "FedEx": ("Memphis", "TN", "US", "38101"),
    "DHL": ("Leipzig", "", "DE", "04103"),
    "RoyalMail": ("London", "", "GB", "EC1A 1BB"),
    "JapanPost": ("Tokyo", "", "JP", "100-0001"),
}


def _when(days: float) -> dict[str, float]:
    """``days`` from now (negative: ago)."""
    return {"days": days}


def _event(carrier: str, days: float, status: str, message: str, detail: str = "unknown") -> dict[str, Any]:
    city, state, country, zip_code = _CITIES[carrier]
    place = {"city": city, "state": state, "country": country, "zip": zip_code}
    return {"at": _when(days), "status": status, "message": message, "status_detail": detail, **place}


def _tracker(order_id: str, status: str, *, delivered_after: float | None = None, **extra: Any) -> dict[str, Any]:
    """A tracker for the order's shipment; ``delivered_after``: days after payment the parcel arrived."""
    carrier, code = SHIPMENTS[order_id]
    paid = -_PAID_DAYS_AGO[order_id]
    events = [
        _event(carrier, paid + 0.1, "pre_transit", "Shipping label created", "label_created"),
        _event(carrier, paid + 0.6, "in_transit", "Accepted at origin facility", "arrived_at_facility"),
    ]
    if delivered_after is not None:
        arrived = paid + delivered_after
        events.append(_event(carrier, arrived - 0.2, "out_for_delivery", "Out for delivery", "out_for_delivery"))
        events.append(_event(carrier, arrived, "delivered", "Delivered", "arrived_at_destination"))
    return {"carrier": carrier, "tracking_code": code, "status": status, "events": events, **extra}


def _trackers() -> list[dict[str, Any]]:
    lost = _tracker("ord_1011", "return_to_sender")
    paid_1011 = -_PAID_DAYS_AGO["ord_1011"]
    lost["status_detail"] = "return"
    lost["events"] += [
        _event("USPS", paid_1011 + 2, "failure", "Delivery attempted: address not found", "address_not_found"),
        _event("USPS", paid_1011 + 3, "return_to_sender", "Returned to sender", "return"),
    ]
    moving_1007 = _tracker("ord_1007", "in_transit", est_delivery=_when(3))
    moving_1013 = _tracker("ord_1013", "in_transit", est_delivery=_when(2))
    out_1010 = _tracker("ord_1010", "out_for_delivery", est_delivery=_when(0.3))
    out_1010["events"].append(_event("RoyalMail", -0.1, "out_for_delivery", "Out for delivery", "out_for_delivery"))
    return [
        _tracker("ord_1001", "delivered", delivered_after=2, photo=True, status_detail="arrived_at_destination"),
        _tracker("ord_1002", "delivered", delivered_after=3, signed_by="G HOPPER"),
        _tracker("ord_1003", "delivered", delivered_after=4),
        _tracker("ord_1005", "delivered", delivered_after=5),
        _tracker("ord_1006", "delivered", delivered_after=2),
        moving_1007,
        _tracker("ord_1009", "delivered", delivered_after=3),
        out_1010,
        lost,
        _tracker("ord_1012", "delivered", delivered_after=3, signed_by="G HOPPER"),
        moving_1013,
        _tracker("ord_1014", "delivered", delivered_after=4),
        _tracker("ord_1015", "delivered", delivered_after=4),
        _tracker("ord_1016", "delivered", delivered_after=3),
        _tracker("ord_1017", "delivered", delivered_after=3),
    ]


def _returns() -> list[dict[str, Any]]:
    return [
        {
            "order_id": "ord_1014",
            "rma_id": 71014,
            "state": "inspected",
            "currency": "USD",
            "label_created": _when(-12),
            "shipped": _when(-10),
            "received": _when(-6),
            "lines": [
                {"sku": "GRINDER-1", "description": "Coffee grinder", "quantity": 1, "amount": "80.00"}
                | {"received": True, "condition": "new"},
                {"sku": "KETTLE-1", "description": "Kettle", "quantity": 1, "amount": "50.00"},
            ],
        },
        {
            "order_id": "ord_1015",
            "rma_id": 71015,
            "state": "label_created",
            "currency": "USD",
            "label_created": _when(-20),
            "lines": [{"sku": "YOGA-1", "description": "Yoga mat", "quantity": 1, "amount": "55.00"}],
        },
    ]


def _comment(role: str, author: str, body: str, days: float) -> dict[str, Any]:
    return {"role": role, "author_name": author, "body": body, "at": _when(days)}


def _tickets() -> list[dict[str, Any]]:
    ada = {"requester_email": _EMAIL["cus_ada"], "requester_name": _NAME["cus_ada"]}
    omar = {"requester_email": _EMAIL["cus_omar"], "requester_name": _NAME["cus_omar"]}
    return [
        ada
        | {
            "id": 4101,
            "subject": "Espresso machine arrived dented",
            "status": "solved",
            "created": _when(-16),
            "comments": [
                _comment("end-user", "Ada Lovelace", "My espresso machine (ord_1003) arrived with a dent.", -16),
                _comment("agent", "Sam Rivera", "Sorry about that. We refunded 50.00 EUR for the dent.", -15),
                _comment("end-user", "Ada Lovelace", "Thank you, that is fine.", -15),
            ],
        },
        ada
        | {
            "id": 4102,
            "subject": "Where is my order?",
            "status": "closed",
            "created": _when(-60),
            "comments": [
                _comment("end-user", "Ada Lovelace", "My order has not shown up yet.", -60),
                _comment("agent", "Sam Rivera", "It was delivered this morning; tracking shows it.", -59),
            ],
        },
        omar
        | {
            "id": 4103,
            "subject": "Chargeback on ord_1004 (headphones)",
            "status": "open",
            "created": _when(-10),
            "comments": [
                _comment("admin", "Priya Shah", "The bank opened a chargeback on ord_1004; asking the customer.", -10),
                _comment("end-user", "Omar Haddad", "I never received the headphones, so I asked my bank.", -9),
            ],
        },
    ]


def demo_evidence() -> dict[str, Any]:
    """The evidence sandbox's demo data (an ``EvidenceSeed``)."""
    return {"trackers": _trackers(), "returns": _returns(), "tickets": _tickets()}


def _minor(order_id: str) -> tuple[int, str]:
    for oid, _c, currency, captured, *_rest in ORDERS:
        if oid == order_id:
            return to_minor(Decimal(captured), currency), currency.lower()
    raise KeyError(order_id)


def demo_risk() -> dict[str, Any]:
    """The payments sandbox's demo risk signals (a ``RiskSeed``): an early fraud warning and two disputes."""
    disputes = []
    for order_id, reason, status, days in (
        ("ord_1017", "product_not_received", "needs_response", -2),
        ("ord_1004", "product_not_received", "under_review", -10),
    ):
        amount, currency = _minor(order_id)
        disputes.append(
            {"charge": charge_id(order_id), "amount": amount, "currency": currency, "reason": reason}
            | {"status": status, "created": _when(days)}
        )
    warning = {"charge": charge_id("ord_1016"), "fraud_type": "made_with_stolen_card", "actionable": True}
    return {"early_fraud_warnings": [warning | {"created": _when(-1)}], "disputes": disputes}
