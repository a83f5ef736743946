"""provider refund status: a refund the provider has not settled yet waits as rows

Revision ID: 0008
Revises: 0007

A Stripe refund can stay ``pending`` for days and then fail. The refund's row keeps the provider's
status and failure reason, and an index finds a refund by its provider refund id (the webhook's key).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.add_column(sa.Column("provider_status", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("provider_failure_reason", sa.String(length=64), nullable=True))
        batch.create_index("ix_refunds_provider_refund_id", ["provider_refund_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.drop_index("ix_refunds_provider_refund_id")
        batch.drop_column("provider_failure_reason")
        batch.drop_column("provider_status")
