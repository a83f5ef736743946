"""provider events: what each verified webhook event (or re-read) said about a refund, and what came of it

Revision ID: 0011
Revises: 0010

A provider's event only changes a refund when the provider refund it names is the one the refund's row
holds (same id, metadata key, amount, currency and charge). Every event is recorded once with its
outcome (accepted, ignored, rejected) and a reason, so /metrics counts them across the cluster.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_events",
        sa.Column("event_key", sa.String(length=300), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("refund_id", sa.String(length=200), nullable=True),
        sa.Column("provider_refund_id", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_key"),
    )
    op.create_index("ix_provider_events_refund_id", "provider_events", ["refund_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_provider_events_refund_id", table_name="provider_events")
    op.drop_table("provider_events")
