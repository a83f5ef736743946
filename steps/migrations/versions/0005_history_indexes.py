"""history indexes: a customer's refund history reads a bounded number of rows per order

Revision ID: 0005
Revises: 0004

``ix_refunds_order_id_created_at`` replaces ``ix_refunds_order_id`` (its leading column serves the
same lookups); ``ix_orders_customer_id`` finds a customer's orders without scanning all orders.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orders") as batch:
        batch.create_index("ix_orders_customer_id", ["customer_id"], unique=False)
    with op.batch_alter_table("refunds") as batch:
        batch.create_index("ix_refunds_order_id_created_at", ["order_id", "created_at"], unique=False)
        batch.drop_index("ix_refunds_order_id")


def downgrade() -> None:
    with op.batch_alter_table("refunds") as batch:
        batch.create_index("ix_refunds_order_id", ["order_id"], unique=False)
        batch.drop_index("ix_refunds_order_id_created_at")
    with op.batch_alter_table("orders") as batch:
        batch.drop_index("ix_orders_customer_id")
