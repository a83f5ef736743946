"""customer questions: a refund's one question to its customer, its answer, and the files sent with it

Revision ID: 0016
Revises: 0015

A refund whose gap only the customer can close (a delivery to confirm, a photo of the item, a return's tracking
number) records its question here with its reminder and deadline, and the answer once it comes (steps/questions.py);
files uploaded with an answer are kept as bytes with their type, size and SHA-256, never served back.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "customer_questions",
        sa.Column("refund_id", sa.String(length=200), primary_key=True),
        sa.Column("question", sa.String(length=32), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("remind_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reminded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("case_file", sa.JSON(), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("answer_key", sa.String(length=300), nullable=True),
    )
    op.create_table(
        "customer_answer_files",
        sa.Column("refund_id", sa.String(length=200), primary_key=True),
        sa.Column("sha256", sa.String(length=64), primary_key=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("content_type", sa.String(length=100), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("customer_answer_files")
    op.drop_table("customer_questions")
