"""slack deliveries: remember each signed Slack request so replays are refused

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slack_deliveries",
        sa.Column("signature", sa.String(length=128), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("signature"),
    )


def downgrade() -> None:
    op.drop_table("slack_deliveries")
