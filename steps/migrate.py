"""Alembic migrations of the application database (``refund-agent migrate``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from steps.store import create_engine, normalize_url

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


@contextmanager
def _alembic_quiet() -> Iterator[None]:
    """Alembic logs a line per revision and per plugin at INFO; keep them for DEBUG only."""
    alembic = logging.getLogger("alembic")
    level = alembic.level
    if not log.isEnabledFor(logging.DEBUG):
        alembic.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic.setLevel(level)


def current_revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


@functools.cache
def head_revision() -> str | None:
    """The newest migration this release ships (read once: Alembic loads every migration file to find it)."""
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision`` and log one line saying where the database is. A database already at the head is
    only read: every process start migrates, and Alembic's run costs tens of milliseconds even with nothing to do."""
    config = alembic_config(url)
    with _alembic_quiet():
        before = current_revision(url)
        if revision == "head" and before is not None and before == head_revision():
            log.info("application database at revision %s (0 applied)", before)
            return
        command.upgrade(config, revision)
        after = current_revision(url)
        scripts = ScriptDirectory.from_config(config)
        applied = 0 if before == after else sum(1 for _ in scripts.iterate_revisions(after, before))
    log.info("application database at revision %s (%d applied)", after, applied)
