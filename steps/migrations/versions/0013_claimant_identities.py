"""claimant identities: who an order went to and what paid for it, and one mailbox per customer

Revision ID: 0013
Revises: 0012

A claimant is counted across the identities an order holds, not only its customer id. Orders carry the
shipping address (as typed, and as one address: case, punctuation and whitespace ignored) and the paying
card's fingerprint; customers carry their email as one mailbox (case and a +tag ignored), filled in here for
the customers already held. Each key is indexed: a case file looks up every customer id that shares one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _email_key(email: str) -> str:
    """steps.records.email_key as of this revision (a migration never changes with the code after it)."""
    local, at, domain = email.strip().casefold().partition("@")
    return f"{local.split('+', 1)[0]}{at}{domain}" if at else local


def upgrade() -> None:
    with op.batch_alter_table("customers") as batch:
        batch.add_column(sa.Column("email_key", sa.String(length=320), nullable=False, server_default=""))
        batch.create_index("ix_customers_email_key", ["email_key"])
    with op.batch_alter_table("orders") as batch:
        batch.add_column(sa.Column("shipping_address", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("address_key", sa.String(length=400), nullable=False, server_default=""))
        batch.add_column(sa.Column("card_fingerprint", sa.String(length=64), nullable=False, server_default=""))
        batch.create_index("ix_orders_address_key", ["address_key"])
        batch.create_index("ix_orders_card_fingerprint", ["card_fingerprint"])
    customers = sa.table("customers", sa.column("customer_id", sa.String), sa.column("email", sa.String))
    keyed = sa.table("customers", sa.column("customer_id", sa.String), sa.column("email_key", sa.String))
    conn = op.get_bind()
    for customer_id, email in conn.execute(sa.select(customers.c.customer_id, customers.c.email)).all():
        conn.execute(keyed.update().where(keyed.c.customer_id == customer_id).values(email_key=_email_key(email or "")))


def downgrade() -> None:
    with op.batch_alter_table("orders") as batch:
        batch.drop_index("ix_orders_card_fingerprint")
        batch.drop_index("ix_orders_address_key")
        batch.drop_column("card_fingerprint")
        batch.drop_column("address_key")
        batch.drop_column("shipping_address")
    with op.batch_alter_table("customers") as batch:
        batch.drop_index("ix_customers_email_key")
        batch.drop_column("email_key")
