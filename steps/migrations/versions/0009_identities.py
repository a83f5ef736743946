"""identities: API clients with scopes, who requested each refund, the channel of each decision

Revision ID: 0009
Revises: 0008

One API token did everything. Clients now have their own keys (hashed) and scopes; every refund records
the principal that requested it (and the operator that client acts for), so the requester can be kept from
deciding it; a decision records the channel it came through.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_clients",
        sa.Column("client_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column("operator", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("client_id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("key_hash"),
    )
    with op.batch_alter_table("refunds") as batch:
        batch.add_column(sa.Column("requested_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("requester_operator", sa.String(length=100), nullable=True))
    with op.batch_alter_table("approval_decisions") as batch:
        batch.add_column(sa.Column("via", sa.String(length=200), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("approval_decisions") as batch:
        batch.drop_column("via")
    with op.batch_alter_table("refunds") as batch:
        batch.drop_column("requester_operator")
        batch.drop_column("requested_by")
    op.drop_table("api_clients")
