"""refund reservations: the amount a refund is paying is held against its order until it settles

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.add_column(sa.Column("reserved_amount_minor", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.drop_column("reserved_amount_minor")
