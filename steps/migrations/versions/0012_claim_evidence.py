"""claim evidence: where an order was shipped, and what a refund's claim was and what was looked up about it

Revision ID: 0012
Revises: 0011

Orders carry the carrier and tracking code of their shipment (empty for orders from before, and for
orders never shipped). A refund records the claim's category the agent named and the evidence its look-ups
returned (carrier tracking, the warehouse's return, the charge's risk signals, earlier tickets), as policy
judged it; NULL on refunds from before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orders") as batch:
        batch.add_column(sa.Column("carrier", sa.String(length=32), nullable=False, server_default=""))
        batch.add_column(sa.Column("tracking_code", sa.String(length=64), nullable=False, server_default=""))
    with op.batch_alter_table("refunds") as batch:
        batch.add_column(sa.Column("claim_category", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("evidence", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.drop_column("evidence")
        batch.drop_column("claim_category")
    with op.batch_alter_table("orders") as batch:
        batch.drop_column("tracking_code")
        batch.drop_column("carrier")
