"""console sessions: server-side sign-in sessions and a shared sign-in throttle

Revision ID: 0010
Revises: 0009

Console sessions were signed cookies: a copied cookie outlived its sign-out and a removed operator kept
their role until it expired. Sessions are now rows (the cookie carries a random id, the row its hash)
checked on every request; failed sign-ins are counted in the database so every API process shares them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("operator", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("credentials", sa.String(length=64), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("user_agent", sa.String(length=300), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("session_hash"),
    )
    op.create_index("ix_console_sessions_operator", "console_sessions", ["operator"], unique=False)
    op.create_table(
        "console_sign_in_throttle",
        sa.Column("throttle_key", sa.String(length=100), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("window_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("throttle_key"),
    )
    op.create_index("ix_console_sign_in_throttle_updated_at", "console_sign_in_throttle", ["updated_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_console_sign_in_throttle_updated_at", table_name="console_sign_in_throttle")
    op.drop_table("console_sign_in_throttle")
    op.drop_index("ix_console_sessions_operator", table_name="console_sessions")
    op.drop_table("console_sessions")
