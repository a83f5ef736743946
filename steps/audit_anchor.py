"""The audit chain's anchor: how many entries the chain held and the MAC of the last, kept outside the database.

The chain's MACs catch an entry changed, inserted or removed before the last one; they cannot catch the newest
entries deleted (nothing after them is left to fail its link), nor a chain rewritten whole where unkeyed entries
are allowed. The anchor can: a small file in the data directory (0600; written whole under another name, then
renamed) that a database writer cannot reach, carrying its own MAC under the audit key so it cannot be made up.

It moves forward only after an append has committed (``advance``, once the connection is handed back), only to an
entry the database holds with that MAC, only past an anchored entry the chain still holds, and never back: several
processes appending on one host take a file lock around it. A crash between a commit and the anchor's update
leaves it an entry or a few behind, which a check accepts; a chain shorter than its anchor, or a different MAC at
the anchored entry, is reported.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

log = logging.getLogger(__name__)

#: The anchor's file name in the data directory (``REFUND_AGENT_DATA_DIR``).
ANCHOR_FILE = "audit.anchor"
GENESIS_MAC = "0" * 64

_in_process = threading.Lock()


class AnchorError(Exception):
    """The anchor cannot be read, or is not one the audit key wrote."""


@dataclass(frozen=True)
class Anchor:
    entries: int
    """How many entries the chain held (its last entry's ``seq``)."""
    last_mac: str
    """That entry's MAC (``GENESIS_MAC`` for none)."""


GENESIS = Anchor(0, GENESIS_MAC)


def _mac(key: bytes, anchor: Anchor) -> str:
    body = json.dumps(["audit-anchor", anchor.entries, anchor.last_mac], separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def read(path: Path, key: bytes) -> Anchor:
    """The anchor at ``path``; ``AnchorError`` when it is missing, unreadable, or not written under ``key``."""
    try:
        data = json.loads(path.read_text())
        anchor = Anchor(int(data["entries"]), str(data["last_mac"]))
        mac = str(data["mac"])
    except FileNotFoundError as error:
        raise AnchorError(f"no audit anchor at {path}") from error
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise AnchorError(f"the audit anchor {path} cannot be read ({error.__class__.__name__})") from error
    if anchor.entries < 0 or not hmac.compare_digest(_mac(key, anchor), mac):
        raise AnchorError(f"the audit anchor {path} does not carry the audit key's MAC (made up, or another key's)")
    return anchor


def _write(path: Path, key: bytes, anchor: Anchor, *, replace: bool = True) -> None:
    """Write the anchor whole under another name, then rename (or, with ``replace=False``, link: never over one)."""
    text = json.dumps({"entries": anchor.entries, "last_mac": anchor.last_mac, "mac": _mac(key, anchor)})
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text + "\n")
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(staged, path)
        else:
            with contextlib.suppress(FileExistsError):  # another process began it first
                os.link(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def ensure(path: Path, key: bytes) -> None:
    """Begin the anchor at no entries when there is none yet (a new install, or a chain from before anchors: its
    entries are anchored from the next append on). A process that begins appending calls this first, so a crash
    after its first append leaves an anchor behind the chain, never none."""
    if path.exists():
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(path, key, GENESIS, replace=False)
    log.info("audit anchor begun at %s", path)


#: Reads the MACs of the given entries (by seq) from the database, as committed.
Lookup = Callable[[tuple[int, ...]], Mapping[int, str]]


def advance(path: Path, key: bytes, to: Anchor, lookup: Lookup) -> bool:
    """Move the anchor forward to ``to`` (an entry this process appended) once the database holds it; True if moved.

    Under a lock shared by every process on this host (and this process's threads), so it only ever grows. Not
    moved when ``to`` is not past it, when the database does not hold ``to`` (its transaction rolled back), or
    when the database no longer holds the anchored entry (rewritten or cut: the anchor keeps saying so).
    """
    lock = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with _in_process:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = read(path, key)
            if to.entries <= current.entries:
                return False
            held = lookup((current.entries, to.entries))
            if held.get(to.entries) != to.last_mac:
                return False
            if current.entries and held.get(current.entries) != current.last_mac:
                log.error(
                    "audit chain no longer holds anchored entry %d (rewritten or cut); the anchor stays there",
                    current.entries,
                )
                return False
            _write(path, key, to)
            return True
    finally:
        os.close(lock)  # releases the lock


@dataclass(frozen=True)
class _Appended:
    path: Path
    key: bytes
    entry: Anchor
    lookup: str


#: Where a connection keeps the last entry it appended until it is handed back (its ``info``, kept by the pool).
_PENDING = "audit.appended"
#: The committed MACs of two entries, read on the DBAPI connection just handed back (no pool checkout).
_LOOKUP = {
    "sqlite": "SELECT seq, hash FROM audit_log WHERE seq IN (?, ?)",
    "postgresql": "SELECT seq, hash FROM audit_log WHERE seq IN (%s, %s)",
}


def note_append(conn: sa.Connection, path: Path, key: bytes, entry: Anchor) -> None:
    """Remember that ``conn`` appended ``entry``: the anchor at ``path`` moves to it when the connection is handed
    back to its pool, its transaction over, if the entry was committed (SQLAlchemy has no after-commit hook for a
    plain connection; the pool's check-in comes after commit or rollback, and the read there tells which)."""
    if not sa.event.contains(conn.engine, "checkin", _handed_back):
        sa.event.listen(conn.engine, "checkin", _handed_back)
    conn.info[_PENDING] = _Appended(path, key, entry, _LOOKUP[conn.dialect.name])


def _handed_back(dbapi_conn: Any, record: Any) -> None:
    appended = record.info.pop(_PENDING, None) if record is not None else None
    if appended is None or dbapi_conn is None:
        return

    def lookup(seqs: tuple[int, ...]) -> Mapping[int, str]:
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(appended.lookup, seqs)
            return {int(seq): str(mac) for seq, mac in cursor.fetchall()}
        finally:
            cursor.close()
            dbapi_conn.rollback()

    try:
        advance(appended.path, appended.key, appended.entry, lookup)
    except Exception:  # the anchor stays behind, which a check accepts; the connection goes back regardless
        log.warning("audit anchor not moved to entry %d", appended.entry.entries, exc_info=True)
