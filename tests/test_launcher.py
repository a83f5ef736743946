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


def test_a_forked_command_has_exactly_the_environment_and_directory_asked_for_and_ends_as_a_cold_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the launcher's own environment reaches a command: not in ``os.environ``, not in the C library's."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://launcher-only/never")  # the launcher's, never asked for
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # its commands' output is buffered, as a cold one's is
    launcher = zygote.Launcher()
    try:
        asked = {"PATH": os.environ["PATH"], "REFUND_AGENT_DATA_DIR": str(tmp_path / "data")}
        with open(tmp_path / "probe.json", "w+b") as out:
            probe = launcher.launch(
                [], env=asked, stdin=0, stdout=out.fileno(), stderr=2, cwd=tmp_path, probe=["DATABASE_URL", "PATH"]
            )
            assert probe.wait(60) == 0
            out.seek(0)
            first, *rest = out.read().decode().splitlines()
            seen = json.loads(first)
    finally:
        launcher.close()
    assert rest == ["a running thread finished", "an exit handler ran"]  # as a cold process ends
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


def _launched_by(launcher: zygote.Launcher) -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _alive_child(int(p.name), launcher)}


def _alive_child(pid: int, launcher: zygote.Launcher) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] != "Z" and int(stat[1]) == launcher.proc.pid


def _path_env() -> dict[str, str]:
    warm = zygote.command_dir()
    assert warm is not None
    return {**os.environ, "PATH": f"{warm}{os.pathsep}{os.environ['PATH']}"}


def test_refund_agent_on_the_docs_path_answers_as_the_console_script(tmp_path: Path) -> None:
    """The PATH command the docs tests type (tests/warm_command.py): same output, exit status and standard input as
    the installed console script, through bash."""
    script = Path(zygote.cold_command()[0]).parent / "refund-agent"
    line = "{} approve no-such-refund --approver dana; echo status=$?; echo 'a long passphrase' | {} hash-password"
    warm = subprocess.run(
        ["bash", "-c", line.format("refund-agent", "refund-agent")],
        env=_path_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    cold = subprocess.run(
        ["bash", "-c", line.format(script, script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    launcher = zygote.launcher()
    assert launcher is not None
    assert "status=" in warm.stdout and warm.stdout.splitlines()[:-1] == cold.stdout.splitlines()[:-1]
    assert warm.stdout.splitlines()[-1].startswith("scrypt$")
    assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]


@pytest.mark.parametrize("signal_sent", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_started_through_the_docs_path_stops_with_its_process_group(
    tmp_path: Path, signal_sent: signal.Signals
) -> None:
    """A test stops a docs server by signalling its process group: TERM reaches the forked server through the PATH
    command; after KILL (the command gone without word) the server stops itself."""
    launcher = zygote.launcher()
    assert launcher is not None
    before = _launched_by(launcher)
    port = processes.free_port()
    with open(tmp_path / "server.log", "wb") as log:
        shell = subprocess.Popen(
            ["bash", "-c", f"refund-agent sandbox-evidence --port {port}"],
            env=_path_env(),
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: processes.http_ok(f"http://127.0.0.1:{port}/_sandbox/healthz"), timeout=60, what="it")
        [server] = _launched_by(launcher) - before
        os.killpg(shell.pid, signal_sent)
        assert shell.wait(timeout=30) == -signal_sent
        wait_for(lambda: not _alive_child(server, launcher), timeout=30, what="the forked server to stop")
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
