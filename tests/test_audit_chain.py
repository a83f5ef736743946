"""The audit chain is keyed (HMAC-SHA256, the key outside the database): a rewrite recomputed without the key,
with plain SHA-256 or under another key, is caught at the rewritten entry; entries from before the key are
accepted only as the chain's prefix, and counted; nothing is appended without a key."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from agent.ops.processes import child_env
from steps import audit
from steps.migrate import upgrade
from steps.store import audit_log, create_engine, utc
from tests.conftest import Env

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OTHER_KEY = b"someone else's key, 32 bytes long!"

Digest = Callable[[bytes], str]


def plain_sha256(body: bytes) -> str:
    """How entries were hashed before the chain had a key (and all an attacker without the key can compute)."""
    return hashlib.sha256(body).hexdigest()


def mac_under(key: bytes) -> Digest:
    return lambda body: hmac.new(key, body, hashlib.sha256).hexdigest()


def body_of(row: sa.Row[tuple[object, ...]], prev: str) -> bytes:
    """An entry's content as the chain commits to it (its layout is the one every release has used)."""
    fields = [row.seq, row.refund_id, row.event, row.payload, utc(row.created_at).isoformat(), prev]
    return json.dumps(fields, separators=(",", ":")).encode()


@pytest.fixture
def engine(env: Env) -> Iterator[sa.Engine]:
    upgrade(env.dbs.app_url)
    engine = create_engine(env.dbs.app_url)
    yield engine
    engine.dispose()


def append_keyed(engine: sa.Engine, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        with engine.begin() as conn:
            payload = {"amount": f"{n}.00"}
            audit.append(conn, refund_id=f"r-{n}", event="refund_paid", payload=payload, now=T0 + timedelta(n))


def append_unkeyed(engine: sa.Engine, count: int, start: int = 0) -> None:
    """Entries as a release before the key wrote them: plain SHA-256 over the same content."""
    for n in range(start, start + count):
        with engine.begin() as conn:
            last = conn.execute(sa.select(audit_log).order_by(audit_log.c.seq.desc()).limit(1)).first()
            seq, prev = (last.seq + 1, last.hash) if last else (1, audit.GENESIS)
            values = {
                "seq": seq,
                "refund_id": f"r-{n}",
                "event": "refund_paid",
                "payload": json.dumps({"amount": f"{n}.00"}),
                "created_at": T0 + timedelta(n),
                "prev_hash": prev,
            }
            conn.execute(audit_log.insert().values(**values, hash=""))
            row = conn.execute(sa.select(audit_log).where(audit_log.c.seq == seq)).one()
            conn.execute(audit_log.update().where(audit_log.c.seq == seq).values(hash=plain_sha256(body_of(row, prev))))


def rewrite(engine: sa.Engine, seq: int, payload: str, digest: Digest, *, first: int, last: int | None = None) -> None:
    """Change one entry's payload, recompute the hashes of entries ``first`` to ``last`` (default: the end) with
    ``digest``, and link the entry after them to the new ones, as someone who can write the database would."""
    with engine.begin() as conn:
        conn.execute(audit_log.update().where(audit_log.c.seq == seq).values(payload=payload))
        rows = conn.execute(sa.select(audit_log).order_by(audit_log.c.seq)).all()
        prev = audit.GENESIS
        for row in rows:
            if row.seq < first:
                prev = row.hash
            elif last is None or row.seq <= last:
                new = digest(body_of(row, prev))
                conn.execute(audit_log.update().where(audit_log.c.seq == row.seq).values(prev_hash=prev, hash=new))
                prev = new
            else:
                conn.execute(audit_log.update().where(audit_log.c.seq == row.seq).values(prev_hash=prev))
                break


def verify(engine: sa.Engine) -> audit.ChainReport:
    with engine.connect() as conn:
        return audit.verify(conn)


def audit_verify(env: Env, *flags: str) -> subprocess.CompletedProcess[str]:
    """`refund-agent audit verify` in its own process, with the service's key (generated in the data directory)."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "audit", "verify", *flags],
        env=child_env(env.env_vars()),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_nothing_is_appended_without_the_key(env: Env, engine: sa.Engine) -> None:
    audit.use_key(None)
    with pytest.raises(audit.AuditKeyMissing), engine.begin() as conn:
        audit.append(conn, refund_id="r-1", event="refund_paid", payload={}, now=T0)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one() == 0
        with pytest.raises(audit.AuditKeyMissing):
            audit.verify(conn)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        audit.use_key(b"sixteen byte key")


def test_a_keyed_chain_verifies_with_its_key_and_with_no_other(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 4)
    assert verify(engine) == audit.ChainReport(True, 4)
    with engine.connect() as conn:
        other = audit.verify(conn, key=OTHER_KEY)
    assert not other.ok and other.first_broken_seq == 1 and "audit key" in other.problem
    done = audit_verify(env)
    assert done.returncode == 0 and done.stdout.strip() == "audit chain intact: 4 entries", done.stdout + done.stderr


def test_entries_from_before_the_key_are_accepted_as_the_prefix_and_counted(env: Env, engine: sa.Engine) -> None:
    append_unkeyed(engine, 3)
    append_keyed(engine, 2, start=3)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(audit_log).order_by(audit_log.c.seq)).all()
    assert rows[3].prev_hash == rows[2].hash  # the first keyed entry's MAC covers the last unkeyed one
    assert verify(engine) == audit.ChainReport(True, 5, unkeyed=3)
    done = audit_verify(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact: 5 entries; 3 of them, first in the chain, from before the audit key" in done.stdout
    assert audit_verify(env, "--max-unkeyed", "3").returncode == 0


def test_an_unkeyed_entry_after_a_keyed_one_breaks_the_chain(env: Env, engine: sa.Engine) -> None:
    append_unkeyed(engine, 2)
    append_keyed(engine, 2, start=2)
    append_unkeyed(engine, 1, start=4)
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 5 and "without the audit key" in report.problem


@pytest.mark.parametrize("digest", [plain_sha256, mac_under(OTHER_KEY)], ids=["plain-sha256", "another-key"])
def test_a_rewrite_recomputed_without_the_key_is_caught_at_the_rewritten_entry(
    env: Env, engine: sa.Engine, digest: Digest
) -> None:
    append_unkeyed(engine, 2)
    append_keyed(engine, 6, start=2)
    rewrite(engine, 5, json.dumps({"amount": "4200.00"}), digest, first=5)  # every hash from entry 5 on
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 5, report
    done = audit_verify(env)
    assert done.returncode == 1 and "audit chain BROKEN at entry 5:" in done.stdout, done.stdout + done.stderr


def test_a_rewritten_entry_from_before_the_key_is_caught_by_the_first_keyed_entry(env: Env, engine: sa.Engine) -> None:
    append_unkeyed(engine, 3)
    append_keyed(engine, 3, start=3)
    rewrite(engine, 2, json.dumps({"amount": "4200.00"}), plain_sha256, first=2, last=3)  # the unkeyed part
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 4, report
    assert audit_verify(env).returncode == 1


def test_a_chain_rewritten_whole_without_the_key_fails_the_expected_count_of_unkeyed_entries(
    env: Env, engine: sa.Engine
) -> None:
    """The one rewrite the MACs cannot catch: every entry made unkeyed. It can only raise the unkeyed count."""
    append_unkeyed(engine, 2)
    append_keyed(engine, 4, start=2)
    rewrite(engine, 4, json.dumps({"amount": "4200.00"}), plain_sha256, first=1)
    assert verify(engine) == audit.ChainReport(True, 6, unkeyed=6)
    done = audit_verify(env, "--max-unkeyed", "2")
    assert done.returncode == 1 and "NOT TRUSTED: 6 entries" in done.stdout, done.stdout + done.stderr


def test_audit_verify_without_the_key_refuses_and_makes_none(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 1)
    elsewhere = env.data_dir.parent / "elsewhere"
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "audit", "verify"],
        env=child_env(env.env_vars(REFUND_AGENT_DATA_DIR=str(elsewhere))),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "REFUND_AGENT_AUDIT_KEY" in done.stderr, done.stdout + done.stderr
    assert not elsewhere.exists()  # no key generated, not even a directory for one
