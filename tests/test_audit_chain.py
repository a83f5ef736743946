"""The audit chain is keyed (HMAC-SHA256, the key outside the database): a rewrite recomputed without the key,
with plain SHA-256 or under another key, is caught at the rewritten entry; entries from before the key are
accepted only as the chain's prefix, only as many as allowed (none by default), and counted; nothing is appended
without a key. The anchor outside the database (entry count and last MAC, in the data directory) catches what the
MACs cannot: the newest entries deleted, the chain rewritten whole; a crash before it moves is no alarm."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent.ops.processes import child_env
from steps import audit, audit_anchor
from steps.migrate import upgrade
from steps.store import audit_log, create_engine, utc
from tests import zygote
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
    """The application database, with this process appending and checking as the service does: anchored in the
    data directory, no unkeyed entry allowed."""
    upgrade(env.dbs.app_url)
    engine = create_engine(env.dbs.app_url)
    audit.use_anchor(anchor_of(env))
    yield engine
    engine.dispose()


def anchor_of(env: Env) -> Path:
    return env.settings().audit_anchor_file()


def anchored(env: Env) -> audit_anchor.Anchor:
    return audit_anchor.read(anchor_of(env), env.settings().audit_key())


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


def verify(engine: sa.Engine, **options: object) -> audit.ChainReport:
    with engine.connect() as conn:
        return audit.verify(conn, **options)  # type: ignore[arg-type]


def audit_verify(env: Env, *flags: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """`refund-agent audit verify` in its own process, with the service's key (generated in the data directory)."""
    return zygote.run(["audit", "verify", *flags], env=child_env(env.env_vars(**variables)))


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
    assert verify(engine) == audit.ChainReport(True, 4, anchored=4)
    with engine.connect() as conn:
        other = audit.verify(conn, key=OTHER_KEY, anchors=[])
    assert not other.ok and other.first_broken_seq == 1 and "audit key" in other.problem
    done = audit_verify(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "audit chain intact: 4 entries; its anchor records 4"


def test_entries_from_before_the_key_are_accepted_as_the_prefix_only_as_many_as_allowed(
    env: Env, engine: sa.Engine
) -> None:
    append_unkeyed(engine, 3)
    append_keyed(engine, 2, start=3)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(audit_log).order_by(audit_log.c.seq)).all()
    assert rows[3].prev_hash == rows[2].hash  # the first keyed entry's MAC covers the last unkeyed one
    assert verify(engine, unkeyed_allowed=3) == audit.ChainReport(True, 5, unkeyed=3, anchored=5)
    done = audit_verify(env, "--max-unkeyed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact: 5 entries; 3 of them, first in the chain, from before the audit key" in done.stdout
    upgraded = audit_verify(env, REFUND_AGENT_AUDIT_UNKEYED_ENTRIES="3")  # the setting the console reads too
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    # A new install allows none: an entry without the key's MAC breaks the chain where it stands.
    strict = verify(engine)
    assert not strict.ok and strict.first_broken_seq == 1 and "only the first 0 entries" in strict.problem
    assert verify(engine, unkeyed_allowed=2).first_broken_seq == 3
    done = audit_verify(env)
    assert done.returncode == 1 and "audit chain BROKEN at entry 1: hashed without the audit key" in done.stdout


def test_an_unkeyed_entry_after_a_keyed_one_breaks_the_chain(env: Env, engine: sa.Engine) -> None:
    append_unkeyed(engine, 2)
    append_keyed(engine, 2, start=2)
    append_unkeyed(engine, 1, start=4)
    report = verify(engine, unkeyed_allowed=5)
    assert not report.ok and report.first_broken_seq == 5 and "without the audit key" in report.problem


@pytest.mark.parametrize("digest", [plain_sha256, mac_under(OTHER_KEY)], ids=["plain-sha256", "another-key"])
def test_a_rewrite_recomputed_without_the_key_is_caught_at_the_rewritten_entry(
    env: Env, engine: sa.Engine, digest: Digest
) -> None:
    append_unkeyed(engine, 2)
    append_keyed(engine, 6, start=2)
    rewrite(engine, 5, json.dumps({"amount": "4200.00"}), digest, first=5)  # every hash from entry 5 on
    report = verify(engine, unkeyed_allowed=2)
    assert not report.ok and report.first_broken_seq == 5, report
    done = audit_verify(env, "--max-unkeyed", "2")
    assert done.returncode == 1 and "audit chain BROKEN at entry 5:" in done.stdout, done.stdout + done.stderr


def test_a_rewritten_entry_from_before_the_key_is_caught_by_the_first_keyed_entry(env: Env, engine: sa.Engine) -> None:
    append_unkeyed(engine, 3)
    append_keyed(engine, 3, start=3)
    rewrite(engine, 2, json.dumps({"amount": "4200.00"}), plain_sha256, first=2, last=3)  # the unkeyed part
    report = verify(engine, unkeyed_allowed=3)
    assert not report.ok and report.first_broken_seq == 4, report
    assert audit_verify(env, "--max-unkeyed", "3").returncode == 1


def test_a_chain_rewritten_whole_without_the_key_is_reported(env: Env, engine: sa.Engine) -> None:
    """The one rewrite the MACs cannot catch: every entry made unkeyed. Past the entries allowed to predate the key
    it breaks the chain; and however many are allowed, the anchor's last MAC is not the rewritten last entry's."""
    append_unkeyed(engine, 2)
    append_keyed(engine, 4, start=2)
    rewrite(engine, 4, json.dumps({"amount": "4200.00"}), plain_sha256, first=1)
    assert verify(engine, unkeyed_allowed=6, anchors=[]) == audit.ChainReport(True, 6, unkeyed=6)  # MACs alone
    done = audit_verify(env, "--max-unkeyed", "2")
    assert done.returncode == 1 and "BROKEN at entry 3: hashed without the audit key" in done.stdout, done.stdout
    report = verify(engine, unkeyed_allowed=6)
    assert not report.ok and report.first_broken_seq == 6 and "not the one its anchor" in report.problem, report
    done = audit_verify(env, "--max-unkeyed", "6")
    assert done.returncode == 1 and "BROKEN at entry 6: entry 6 is not the one its anchor" in done.stdout, done.stdout


def test_audit_verify_without_the_key_refuses_and_makes_none(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 1)
    elsewhere = env.data_dir.parent / "elsewhere"
    done = zygote.run(["audit", "verify"], env=child_env(env.env_vars(REFUND_AGENT_DATA_DIR=str(elsewhere))))
    assert done.returncode == 2 and "REFUND_AGENT_AUDIT_KEY" in done.stderr, done.stdout + done.stderr
    assert not elsewhere.exists()  # no key generated, not even a directory for one


def delete_from(engine: sa.Engine, seq: int) -> None:
    with engine.begin() as conn:
        conn.execute(audit_log.delete().where(audit_log.c.seq >= seq))


def test_deleting_the_newest_entries_is_reported_by_the_anchor(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 5)
    assert anchored(env) == audit_anchor.Anchor(5, last_mac(engine, 5))
    delete_from(engine, 4)  # nothing after them is left to fail a link: the MACs alone see an intact chain
    assert verify(engine, anchors=[]) == audit.ChainReport(True, 3)
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 4 and report.anchored == 5, report
    assert "ends at entry 3 but its anchor" in report.problem and "records 5 entries" in report.problem
    done = audit_verify(env)
    assert done.returncode == 1 and "audit chain BROKEN at entry 4: the chain ends at entry 3" in done.stdout
    # Appending on does not bury it: the anchor never moves past an entry the chain no longer holds.
    append_keyed(engine, 3, start=10)
    assert anchored(env).entries == 5
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 5 and "not the one its anchor" in report.problem, report


def last_mac(engine: sa.Engine, seq: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.select(audit_log.c.hash).where(audit_log.c.seq == seq)).scalar_one())


def test_an_entry_spliced_in_from_another_copy_of_the_chain_breaks_its_successors_link(
    env: Env, engine: sa.Engine
) -> None:
    """Every entry keeps a valid MAC and its place in the sequence; only the link to the entry before it tells that
    entry 3 comes from another copy of the chain (a restored backup that went on, a staging copy under one key)."""
    append_keyed(engine, 3)
    with engine.connect() as conn:
        original = conn.execute(sa.select(audit_log).where(audit_log.c.seq == 3)).one()._asdict()
    delete_from(engine, 3)
    append_keyed(engine, 2, start=20)  # the chain goes on from entry 2 with other entries 3 and 4
    with engine.begin() as conn:
        conn.execute(audit_log.update().where(audit_log.c.seq == 3).values(**original))
    report = verify(engine)
    assert not report.ok and report.first_broken_seq == 4 and "prev_hash" in report.problem, report
    assert audit_verify(env).returncode == 1


def test_an_append_rolled_back_never_moves_the_anchor(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 2)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        audit.append(conn, refund_id="r-x", event="refund_paid", payload={}, now=T0)
        raise RuntimeError("the change this entry describes failed")
    assert anchored(env).entries == 2
    append_keyed(engine, 1, start=2)  # entry 3 again, another one: the anchor takes this one
    assert anchored(env) == audit_anchor.Anchor(3, last_mac(engine, 3))
    assert verify(engine).ok


CRASH_AFTER_COMMIT = """
import os, sys
from datetime import UTC, datetime
from pathlib import Path
from steps import audit
from steps.store import create_engine
audit.use_key(sys.argv[2].encode())
audit.use_anchor(Path(sys.argv[3]))
conn = create_engine(sys.argv[1]).connect()
audit.append(conn, refund_id="r-crash", event="refund_paid", payload={}, now=datetime.now(UTC))
conn.commit()
os._exit(0)  # committed; the connection never handed back, so the anchor never moved
"""


def test_a_crash_between_an_append_and_the_anchor_is_not_a_false_alarm(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 2)
    key = env.settings().audit_key().decode()
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_COMMIT, env.dbs.app_url, key, str(anchor_of(env))],
        env=child_env(env.env_vars()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == 0, crashed.stderr
    assert anchored(env).entries == 2  # one entry behind the chain
    assert verify(engine) == audit.ChainReport(True, 3, anchored=2)
    done = audit_verify(env)
    assert done.returncode == 0 and "intact: 3 entries; its anchor records 2" in done.stdout, done.stdout
    append_keyed(engine, 1, start=3)  # the next append anchors past it
    assert verify(engine) == audit.ChainReport(True, 4, anchored=4)


APPEND_MANY = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from steps import audit
from steps.store import create_engine
audit.use_key(sys.argv[2].encode())
audit.use_anchor(Path(sys.argv[3]))
engine = create_engine(sys.argv[1])
for n in range(int(sys.argv[4])):
    with engine.begin() as conn:
        audit.append(conn, refund_id=f"r-{sys.argv[5]}-{n}", event="refund_paid", payload={}, now=datetime.now(UTC))
"""


def test_processes_appending_at_once_leave_the_anchor_at_the_chains_end(env: Env, engine: sa.Engine) -> None:
    key = env.settings().audit_key().decode()
    args = [env.dbs.app_url, key, str(anchor_of(env)), "15"]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", APPEND_MANY, *args, str(n)],
            env=child_env(env.env_vars()),
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    for worker in workers:
        _, errors = worker.communicate(timeout=180)
        assert worker.returncode == 0, errors
    assert verify(engine) == audit.ChainReport(True, 45, anchored=45)  # never moved back, never past the chain
    assert anchored(env) == audit_anchor.Anchor(45, last_mac(engine, 45))


def test_an_anchor_made_up_or_missing_is_reported(env: Env, engine: sa.Engine) -> None:
    append_keyed(engine, 2)
    path = anchor_of(env)
    assert path.stat().st_mode & 0o777 == 0o600
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "entries": 1, "last_mac": last_mac(engine, 1)}))  # an earlier one, unkeyed
    report = verify(engine)
    assert not report.ok and "does not carry the audit key's MAC" in report.problem, report
    path.unlink()
    report = verify(engine)
    assert not report.ok and "no audit anchor at" in report.problem, report
    done = audit_verify(env)
    assert done.returncode == 1 and "BROKEN (anchor): no audit anchor at" in done.stdout, done.stdout
    done = audit_verify(env, "--no-anchor")
    assert done.returncode == 0 and "no anchor checked" in done.stdout, done.stdout


def test_an_append_handed_back_late_never_moves_the_anchor_back(env: Env, engine: sa.Engine) -> None:
    """Two processes append entries 3 and 5; the one with entry 3 hands its connection back last."""
    append_keyed(engine, 5)
    late = audit_anchor.Anchor(3, last_mac(engine, 3))

    def lookup(seqs: tuple[int, ...]) -> dict[int, str]:
        return {seq: last_mac(engine, seq) for seq in seqs}

    assert not audit_anchor.advance(anchor_of(env), env.settings().audit_key(), late, lookup)
    assert anchored(env) == audit_anchor.Anchor(5, last_mac(engine, 5))
