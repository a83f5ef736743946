"""model usage: the model requests and tokens each refund's decision took

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.add_column(sa.Column("model_requests", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("input_tokens", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("output_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.drop_column("output_tokens")
        batch.drop_column("input_tokens")
        batch.drop_column("model_requests")
