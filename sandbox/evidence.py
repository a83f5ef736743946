"""A local evidence service: carrier tracking (EasyPost-shaped), warehouse returns (ShipBob-shaped) and
earlier helpdesk tickets (Zendesk-shaped), each under its own path prefix, seeded in memory.

The seed format is in ``sandbox/evidence_seed.py`` (re-exported here).
"""

from __future__ import annotations

from sandbox.evidence_seed import (
    CommentSeed,
    DisputeSeed,
    EvidenceSeed,
    FraudWarningSeed,
    ReturnLineSeed,
    ReturnSeed,
    RiskSeed,
    TicketSeed,
    TrackerSeed,
    TrackingEventSeed,
    When,
    ago,
    ahead,
)

__all__ = [
    "CommentSeed",
    "DisputeSeed",
    "EvidenceSeed",
    "FraudWarningSeed",
    "ReturnLineSeed",
    "ReturnSeed",
    "RiskSeed",
    "TicketSeed",
    "TrackerSeed",
    "TrackingEventSeed",
    "When",
    "ago",
    "ahead",
]
