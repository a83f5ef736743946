"""help desk: webhook deliveries recorded once, the ticket each refund came from, the customers' comments

Revision ID: 0015
Revises: 0014

The help desk's webhook (agent/http/helpdesk.py) records each signed delivery once by its signature (a replay of
the same bytes changes nothing), links a ticket to the refund it started (the refund's messages are posted back to
that ticket), and keeps the customer's comments on such a ticket as plain text, each comment once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "helpdesk_deliveries",
        sa.Column("signature", sa.String(length=128), primary_key=True),
        sa.Column("event_type", sa.String(length=100), nullable=False),
        sa.Column("ticket_id", sa.String(length=32), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "helpdesk_tickets",
        sa.Column("ticket_id", sa.String(length=32), primary_key=True),
        sa.Column("refund_id", sa.String(length=200), nullable=False, unique=True),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "helpdesk_comments",
        sa.Column("comment_id", sa.String(length=32), primary_key=True),
        sa.Column("ticket_id", sa.String(length=32), nullable=False),
        sa.Column("refund_id", sa.String(length=200), nullable=False),
        sa.Column("author_role", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_helpdesk_comments_ticket_id", "helpdesk_comments", ["ticket_id"])
    op.create_index("ix_helpdesk_comments_refund_id", "helpdesk_comments", ["refund_id"])


def downgrade() -> None:
    op.drop_index("ix_helpdesk_comments_refund_id", table_name="helpdesk_comments")
    op.drop_index("ix_helpdesk_comments_ticket_id", table_name="helpdesk_comments")
    op.drop_table("helpdesk_comments")
    op.drop_table("helpdesk_tickets")
    op.drop_table("helpdesk_deliveries")
