"""executor leases: one live process per DBOS executor id, renewed on the database clock

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "executor_leases",
        sa.Column("executor_id", sa.String(length=200), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("app_version", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("beat_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("executor_id"),
    )


def downgrade() -> None:
    op.drop_table("executor_leases")
