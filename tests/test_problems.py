"""Which database errors the API answers with 503 + Retry-After (retry) rather than 500 (a bug)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from steps.store import transient_database_error


def _engine(path: Path) -> sa.Engine:
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)"))
    return engine


def test_a_locked_sqlite_database_is_transient(tmp_path: Path) -> None:
    holder, other = _engine(tmp_path / "db.sqlite"), _engine(tmp_path / "db.sqlite")
    with holder.connect() as held:
        held.exec_driver_sql("BEGIN IMMEDIATE")
        with pytest.raises(sa.exc.OperationalError) as caught, other.begin() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES ('a')"))
        held.rollback()
    assert "locked" in str(caught.value)
    assert transient_database_error(caught.value) == "OperationalError"
    wrapped = RuntimeError("a library wrapped it")
    wrapped.__cause__ = caught.value
    assert transient_database_error(wrapped) == "OperationalError"


def test_a_constraint_violation_or_a_missing_table_is_not_transient(tmp_path: Path) -> None:
    engine = _engine(tmp_path / "db.sqlite")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO t VALUES ('a')"))
    with pytest.raises(sa.exc.IntegrityError) as duplicate, engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO t VALUES ('a')"))
    with pytest.raises(sa.exc.OperationalError) as missing, engine.begin() as conn:
        conn.execute(sa.text("SELECT * FROM nowhere"))
    assert transient_database_error(duplicate.value) is None
    assert transient_database_error(missing.value) is None
    assert transient_database_error(ValueError("not a database error")) is None
