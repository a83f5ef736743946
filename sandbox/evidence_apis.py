"""The evidence sandbox's three API shapes, rendered from a loaded seed: EasyPost trackers, ShipBob return
orders and Zendesk tickets. Each renderer turns seed offsets into absolute times fixed at load.

EasyPost has no field for a photo proof of delivery; the sandbox serves it as EasyPost's ``carrier_detail``
object carrying an extension field ``proof_of_delivery`` (``"photo"`` or ``"signature"``). ShipBob does not
know what a line was paid; each inventory line carries the extension field ``amount_paid`` (a decimal string,
in ``invoice.currency_code``), and its inspection's condition is ``action_taken[].action_reason``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sandbox.evidence_seed import EvidenceSeed, ReturnSeed, TicketSeed, TrackerSeed, When

#: ShipBob's return order statuses for each seeded state.
SHIPBOB_STATUS = {
    "label_created": "AwaitingArrival",
    "in_transit": "InTransit",
    "received": "Arrived",
    "inspected": "Completed",
    "cancelled": "Cancelled",
}


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def tracker_id(carrier: str, code: str) -> str:
    return "trk_" + hashlib.sha256(f"{carrier.lower()}:{code}".encode()).hexdigest()[:32]


def _tracker_json(seed: TrackerSeed, now: datetime, created: datetime) -> dict[str, Any]:
    details = [
        {
            "object": "TrackingDetail",
            "message": event.message,
            "status": event.status,
            "status_detail": event.status_detail,
            "datetime": iso(event.at.at(now)),
            "source": seed.carrier,
            "tracking_location": {
                "object": "TrackingLocation",
                "city": event.city or None,
                "state": event.state or None,
                "country": event.country or None,
                "zip": event.zip or None,
            },
        }
        for event in seed.events
    ]
    proof = "signature" if seed.signed_by else ("photo" if seed.photo else None)
    return {
        "id": tracker_id(seed.carrier, seed.tracking_code),
        "object": "Tracker",
        "mode": "test",
        "tracking_code": seed.tracking_code,
        "carrier": seed.carrier,
        "status": seed.status,
        "status_detail": seed.status_detail,
        "signed_by": seed.signed_by or None,
        "est_delivery_date": iso(seed.est_delivery.at(now)) if seed.est_delivery else None,
        "created_at": iso(created),
        "updated_at": details[-1]["datetime"] if details else iso(created),
        "tracking_details": details,
        "carrier_detail": {"object": "CarrierDetail", "service": None, "proof_of_delivery": proof},
        "public_url": None,
    }


def unknown_tracker(carrier: str, code: str, now: datetime) -> dict[str, Any]:
    """What EasyPost answers for a code its carrier does not know: a tracker with status ``unknown``."""
    seed = TrackerSeed(carrier=carrier, tracking_code=code, status="unknown")
    return _tracker_json(seed, now, now)


def _user_id(email: str, name: str, role: str) -> int:
    return int(hashlib.sha256(f"{role}:{name}:{email}".encode()).hexdigest()[:10], 16)


@dataclass
class Loaded:
    """The seed with its times fixed: what the APIs serve until the next load."""

    now: datetime
    trackers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(carrier lowercased, tracking code) -> EasyPost tracker JSON."""
    returns: list[dict[str, Any]] = field(default_factory=list)
    tickets: list[dict[str, Any]] = field(default_factory=list)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    users: dict[int, dict[str, Any]] = field(default_factory=dict)


def load(seed: EvidenceSeed, now: datetime) -> Loaded:
    loaded = Loaded(now=now)
    for tracker in seed.trackers:
        created = tracker.events[0].at.at(now) if tracker.events else now
        loaded.trackers[(tracker.carrier.lower(), tracker.tracking_code)] = _tracker_json(tracker, now, created)
    for n, ret in enumerate(seed.returns):
        loaded.returns.append(_return_json(ret, ret.rma_id or 70000 + n, now))
    for n, ticket in enumerate(seed.tickets):
        _add_ticket(loaded, ticket, ticket.id or 1000 + n, now)
    return loaded


def _return_json(ret: ReturnSeed, rma_id: int, now: datetime) -> dict[str, Any]:
    def at(when: When | None) -> str | None:
        return iso(when.at(now)) if when is not None else None

    history = [("AwaitingArrival", ret.label_created), ("InTransit", ret.shipped), ("Arrived", ret.received)]
    inspected = ret.state == "inspected"
    completed = (ret.received or ret.label_created) if inspected else None
    if completed is not None:
        history.append(("Completed", completed))
    inventory = []
    for n, line in enumerate(ret.lines):
        taken = [
            {"action": "Restock" if line.condition in ("new", "opened") else "Quarantine"}
            | {"action_reason": line.condition, "quantity_processed": line.quantity, "image_url": None}
        ]
        inventory.append(
            {
                "id": rma_id * 100 + n,
                "name": line.description,
                "sku": line.sku or None,
                "quantity": line.quantity,
                "amount_paid": str(line.amount),
                "action_requested": {"action": "Default", "action_type": "InventoryDefault", "instructions": None},
                "action_taken": taken if line.received and ret.state in ("received", "inspected") else [],
            }
        )
    return {
        "id": rma_id,
        "reference_id": ret.order_id,
        "status": SHIPBOB_STATUS[ret.state],
        "return_type": "Regular",
        "insert_date": at(ret.label_created),
        "awaiting_arrival_date": at(ret.label_created),
        "arrived_date": at(ret.received),
        "completed_date": at(completed),
        "tracking_number": f"RT{rma_id}",
        "invoice": {"amount": 0.0, "currency_code": ret.currency},
        "inventory": inventory,
        "status_history": [{"status": s, "timestamp": at(w)} for s, w in history if w is not None],
    }


def _add_ticket(loaded: Loaded, ticket: TicketSeed, ticket_id: int, now: datetime) -> None:
    requester = _user_id(ticket.requester_email, ticket.requester_name, "end-user")
    loaded.users[requester] = {
        "id": requester,
        "name": ticket.requester_name,
        "email": ticket.requester_email,
        "role": "end-user",
    }
    comments = []
    for n, comment in enumerate(ticket.comments):
        email = ticket.requester_email if comment.role == "end-user" else f"{comment.role}@support.example"
        author = requester if comment.role == "end-user" else _user_id(email, comment.author_name, comment.role)
        user = {"id": author, "name": comment.author_name, "email": email, "role": comment.role}
        loaded.users.setdefault(author, user)
        comments.append(
            {
                "id": ticket_id * 1000 + n,
                "type": "Comment",
                "author_id": author,
                "body": comment.body,
                "public": True,
                "created_at": iso(comment.at.at(now)),
            }
        )
    loaded.comments[ticket_id] = comments
    created = iso(ticket.created.at(now))
    loaded.tickets.append(
        {
            "id": ticket_id,
            "url": f"/api/v2/tickets/{ticket_id}.json",
            "result_type": "ticket",
            "subject": ticket.subject,
            "description": ticket.comments[0].body if ticket.comments else "",
            "status": ticket.status,
            "requester_id": requester,
            "created_at": created,
            "updated_at": comments[-1]["created_at"] if comments else created,
        }
    )


def add_comment(loaded: Loaded, ticket: dict[str, Any], email: str, body: str, public: bool) -> dict[str, Any]:
    """A comment posted through the API by the agent ``email`` (Zendesk: the token's user), appended to the ticket."""
    author = _user_id(email, "API", "agent")
    loaded.users.setdefault(author, {"id": author, "name": "API", "email": email, "role": "agent"})
    comments = loaded.comments.setdefault(ticket["id"], [])
    now = iso(datetime.now(UTC))
    comment = {
        "id": ticket["id"] * 1000 + len(comments),
        "type": "Comment",
        "author_id": author,
        "body": body,
        "public": public,
        "created_at": now,
    }
    comments.append(comment)
    ticket["updated_at"] = now
    return comment
