"""Alembic environment: migrates the database named in the config, one migrator at a time."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from steps.store import create_engine, metadata

MIGRATION_LOCK = 7_261_001  # Postgres advisory lock: concurrent workers starting up migrate once


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = create_engine(url)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            connection.commit()
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            connection.commit()
    engine.dispose()


run_migrations_online()
