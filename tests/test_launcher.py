"""The suite's warm launcher (tests/zygote.py) gives each command what a cold start gives it: its own process, exactly
the environment and directory asked for, its own streams and its exit status, SIGKILL included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from agent.ops import processes
from agent.ops.processes import child_env, spawn, stop, wait_for
from tests import zygote
from tests.conftest import Env


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_spawned_worker_is_forked_warm_and_dies_by_sigkill(env: Env, tmp_path: Path) -> None:
    worker = spawn(["worker"], env=child_env(env.env_vars()), log=tmp_path / "worker.log")
    try:
        launcher = zygote.launcher()
        assert launcher is not None and isinstance(worker, zygote.Launched)
        assert _ppid(worker.pid) == launcher.proc.pid  # forked by the launcher, not started cold
        assert Path(f"/proc/{worker.pid}/cwd").resolve() == Path.cwd().resolve()
        wait_for(lambda: "worker" in (tmp_path / "worker.log").read_text(), timeout=60, what="the worker's log")
        assert worker.poll() is None
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
        assert worker.poll() == -signal.SIGKILL
    finally:
        stop(worker)


def test_a_forked_command_has_exactly_the_environment_and_directory_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the launcher's own environment reaches a command: not in ``os.environ``, not in the C library's."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://launcher-only/never")  # the launcher's, never asked for
    launcher = zygote.Launcher()
    try:
        asked = {"PATH": os.environ["PATH"], "REFUND_AGENT_DATA_DIR": str(tmp_path / "data")}
        with open(tmp_path / "probe.json", "w+b") as out:
            probe = launcher.launch(
                [], env=asked, stdin=0, stdout=out.fileno(), stderr=2, cwd=tmp_path, probe=["DATABASE_URL", "PATH"]
            )
            assert probe.wait(60) == 0
            out.seek(0)
            seen = json.loads(out.read())
    finally:
        launcher.close()
    assert seen["environ"] == asked
    assert seen["getenv"] == {"DATABASE_URL": None, "PATH": os.environ["PATH"]}
    assert Path(seen["cwd"]) == tmp_path


def test_a_command_run_warm_answers_as_a_cold_one(env: Env, tmp_path: Path) -> None:
    """Same exit status, standard output and error, warm and cold, for a good command and a refused one."""
    variables = child_env(env.env_vars())
    for args in (["clients", "list"], ["approve", "no-such-refund"], ["approve", "x", "--approver", "dana"]):
        warm = zygote.run(args, env=variables, cwd=tmp_path)
        cold = subprocess.run(
            [*zygote.cold_command(), *args], env=variables, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout), args
        assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:], (warm.stderr, cold.stderr)
    assert zygote.run(["hash-password"], env=variables, input="a long passphrase\n").stdout.startswith("scrypt$")


def test_only_the_command_line_is_forked(tmp_path: Path) -> None:
    """Any other program, and a command asked for with options the launcher does not carry, starts as asked."""
    shim = vars(processes)["subprocess"]
    assert isinstance(shim, zygote.Subprocess)
    other = shim.Popen(["sleep", "0"])
    assert not isinstance(other, zygote.Launched) and other.wait(10) == 0
    piped = shim.Popen([*zygote.cold_command(), "--help"], stdout=subprocess.PIPE, start_new_session=True)
    assert not isinstance(piped, zygote.Launched)
    out, _ = piped.communicate(timeout=60)
    assert piped.returncode == 0 and b"refund-agent" in out
