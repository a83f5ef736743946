"""outbox delivery: each message's delivery state, claim and attempts, kept on its outbox row

Revision ID: 0014
Revises: 0013

A delivery worker claims a due row (state ``sending``, its executor id, a token and a lease end on the database
clock, one more attempt) before it sends, and records ``sent`` (with when) or, after a failed attempt, ``pending``
again with the next attempt's time, or ``failed`` with the last error once attempts run out. Rows already in the
outbox start ``pending``: nothing delivered them before, and they go out once a channel is configured.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("delivery_state", sa.String(length=16), nullable=False, server_default="pending"))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("next_attempt_ms", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("claimed_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("claim_token", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("claim_until_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("last_error", sa.String(length=500), nullable=True))
        batch.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_outbox_delivery_state_next_attempt_ms", ["delivery_state", "next_attempt_ms"])


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_index("ix_outbox_delivery_state_next_attempt_ms")
        for column in (
            "sent_at",
            "last_error",
            "claim_until_ms",
            "claim_token",
            "claimed_by",
            "next_attempt_ms",
            "attempts",
            "delivery_state",
        ):
            batch.drop_column(column)
