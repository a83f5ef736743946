"""Files: the data directory is this user's alone (0700) and so is every file in it (0600): the SQLite files
with their -wal and -shm, the generated secrets, the logs; a directory an earlier release left open is closed
at start, and a shared directory such as /tmp is refused."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.ops.processes import free_port, http_ok, spawn, stop, wait_for
from agent.settings import Settings, UnsafeDataDirectory
from steps import clients
from steps.store import create_engine
from tests import web
from tests.test_secrets import clean_env, refund_agent


def modes(directory: Path) -> dict[str, int]:
    """The permission bits of the directory (key ".") and of everything in it."""
    found = {".": stat.S_IMODE(directory.stat().st_mode)}
    found.update({p.name: stat.S_IMODE(p.lstat().st_mode) for p in directory.iterdir()})
    return found


@contextmanager
def serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A real `refund-agent serve` on the embedded default (SQLite and the payments sandbox in the data directory)."""
    port = free_port()
    env = clean_env(tmp_path, REFUND_AGENT_PORT=str(port), PAYMENTS_SANDBOX_PORT=str(free_port()))
    proc = spawn(["serve"], env=env, log=tmp_path / "logs" / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(f"{base}/readyz") or proc.poll() is not None, timeout=90, what="serve to be ready")
        assert proc.poll() is None, (tmp_path / "logs" / "serve.log").read_text()[-3000:]
        yield proc, base
    finally:
        stop(proc)


def _pay_one_refund(tmp_path: Path, base: str) -> None:
    """A refund that writes every database (checkpoints, the book and its audit chain, the provider's ledger)."""
    token = (tmp_path / "data" / "api_token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    with web.client(base_url=base, headers=auth, timeout=30) as http:
        body = {"order_id": "ord_1001", "message": "It arrived broken."}
        accepted = http.post("/refunds", json=body, headers={"Idempotency-Key": "modes-refund-01"})
        assert accepted.status_code == 202, accepted.text
        wait_for(
            lambda: http.get("/refunds/modes-refund-01").json()["status"] == "completed",
            timeout=60,
            what="the refund to complete",
        )


def _private(found: dict[str, int]) -> dict[str, int]:
    return {name: mode for name, mode in found.items() if mode != (0o700 if name == "." else 0o600)}


def test_a_real_serve_run_keeps_the_data_directory_and_every_file_in_it_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(tmp_path) as (_, base):
        _pay_one_refund(tmp_path, base)
        running = modes(data)
    stopped = modes(data)
    for name in ("refund_agent.sqlite", "dbos_system.sqlite", "payments_sandbox.sqlite"):
        assert {name, f"{name}-wal", f"{name}-shm"} <= set(running)
    for name in ("api_token", "approval_signing.key", "audit.key", "console_session.key", "payments_sandbox.log"):
        assert name in running
    assert _private(running) == {} and _private(stopped) == {}


def test_a_data_directory_an_earlier_release_left_open_is_closed_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert refund_agent(tmp_path, "migrate").returncode == 0
    # As an earlier release left it: the directory 0755, its databases and logs 0644, a script of the owner's.
    data.chmod(0o755)
    for path in data.iterdir():
        path.chmod(0o644)
    (data / "server.log").write_text("an earlier run's log\n")
    (data / "server.log").chmod(0o644)
    (data / "backup.sh").write_text("#!/bin/sh\n")
    (data / "backup.sh").chmod(0o755)
    with serving(tmp_path):
        found = modes(data)
    assert found.pop("backup.sh") == 0o700  # others lose every permission, the owner keeps the execute bit
    assert {"refund_agent.sqlite", "dbos_system.sqlite", "server.log"} <= set(found)
    assert _private(found) == {}


def test_a_shared_directory_is_refused_as_the_data_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: everyone's, sticky
    with pytest.raises(UnsafeDataDirectory, match="shared directory"):
        Settings(refund_agent_data_dir=shared).database.secure_data_dir()
    done = refund_agent(tmp_path, "migrate", REFUND_AGENT_DATA_DIR=str(shared))
    assert done.returncode == 2 and "shared directory" in done.stderr
    assert list(shared.iterdir()) == [] and stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_a_client_key_written_with_key_file_is_this_users_alone(tmp_path: Path) -> None:
    """`clients add --key-file` writes the key into a new file, 0600 (a shell's `>` leaves it 0644), and never
    through a file that exists already."""
    key_file = tmp_path / "helpdesk.key"
    add = ("clients", "add", "--scopes", "refunds:create", "--key-file", str(key_file))
    made = refund_agent(tmp_path, *add, "helpdesk")
    assert made.returncode == 0, made.stderr
    assert made.stdout == "" and f"its key is in {key_file} (mode 0600)" in made.stderr
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    engine = create_engine(f"sqlite:///{tmp_path / 'data' / 'refund_agent.sqlite'}")
    try:
        found = clients.authenticate(engine, key_file.read_text().strip())
        assert found is not None and found.name == "helpdesk"
    finally:
        engine.dispose()
    kept = key_file.read_text()
    again = refund_agent(tmp_path, *add, "other")
    assert again.returncode == 2 and "exists already" in again.stderr, again.stderr
    assert key_file.read_text() == kept
    assert "other" not in refund_agent(tmp_path, "clients", "list").stdout
