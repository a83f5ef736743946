"""A warm launcher for the suite's `refund-agent` processes: each command is a fork of one process that has already
imported the command line and the service, so a test pays for a process, not for its imports.

Every ``refund-agent`` process a test starts costs about two seconds of CPU importing Pydantic AI, DBOS,
SQLAlchemy and the service before it does anything, and the suite starts several hundred. The launcher imports them
once per xdist worker; a command is then ``fork()`` and the command line's ``main``. The child is a real process of
its own: its own pid, environment (exactly the one asked for), working directory, standard streams and exit status;
SIGKILL ends it with nothing flushed, as it ends a cold one. What it shares is what nothing reads before a command
runs: imported modules (the product does no work at import time: ARCHITECTURE.md). A few tests still start the
console script cold, for what only a cold start shows (tests/test_startup_output.py, the demo from a fresh
directory, the container image).

The launcher is the parent of the commands it forks, so it reaps them and reports each exit status over the
connection the request came on; ``Launched`` is the ``subprocess.Popen`` the test holds.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from tests.warm_command import read_line

#: What a forked command would otherwise import first: the command line, the service (worker and serve), the
#: console, the sandboxes serve can start, and the tools that join the command line by entry point; then what they
#: import only when a command first needs it: the migrations (alembic), the offline model, the client of an
#: OpenAI-compatible model server (the crash and chaos workers talk to one), and the server's HTTP stack. The
#: payment provider's SDK and anyio load parts on first use, so ``_warm_up`` uses them once. Before the second
#: group was listed, a full run's forked commands spent about a tenth of their CPU importing it, each command again.
WARM = (
    "agent.cli",
    "agent.runtime",
    "agent.http.server",
    "agent.console.views",
    "agent.status",
    "sandbox.payments",
    "sandbox.evidence",
    "uvicorn",
    "proving.commands",
    "steps.migrate",
    "agent.offline",
    "openai",
    "openai.resources.chat.chat",
    "pydantic_ai.models.openai",
    "pydantic_ai.providers.openai",
    "httpcore",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.loops.auto",
    "babel.dates",
)
#: A command line to fork rather than start: ``python -m agent.cli ...``.
_CLI = ("-m", "agent.cli")
#: Set to 1 to start every command cold (a debugging aid: compare a failure with and without the launcher).
COLD_ENV = "REFUND_AGENT_TEST_COLD_START"


# --- the launcher process ---------------------------------------------------------------------------------------

#: A forked command's exit status, set once its ``main`` has returned (``_exit_without_teardown``).
_exit_status: int | None = None


def _exit_without_teardown() -> None:
    """The last exit handler a forked command runs: the process ends once its threads are joined, every other exit
    handler has run (logging's, telemetry's) and its streams are flushed, without the interpreter's teardown.
    Tearing down frees every object the launcher imported, which writes to (and so copies) most of the memory the
    command shares with the launcher: about 0.12 s of CPU and 25,000 page faults a command, for nothing it shows."""
    if _exit_status is None:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(_exit_status)


# Exit handlers run last registered first: registered before the launcher imports anything, this one runs last.
atexit.register(_exit_without_teardown)


def _warm_up() -> None:
    import importlib

    for name in WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import anyio
    import stripe

    _ = (stripe.StripeClient, stripe.Charge, stripe.Refund)
    anyio.run(anyio.sleep, 0)  # imports its asyncio backend
    import gc

    from agent.settings import get_settings

    # What a fork would share and a cold start would not have: a thread (a fork copies only the one that forks) or
    # settings read from the launcher's environment instead of the command's.
    if threading.active_count() != 1:
        raise RuntimeError(f"importing started threads: {[t.name for t in threading.enumerate()]}")
    if get_settings.cache_info().currsize:
        raise RuntimeError("importing read the settings")
    gc.collect()
    gc.freeze()  # the imported objects stay out of every child's collections (and its copied pages)


def _child(
    request: dict[str, Any], fds: list[int], listener: socket.socket, conns: Sequence[socket.socket]
) -> NoReturn:
    """In the forked child: become the command asked for, run it, and exit with its status the way a cold process
    does (``SystemExit`` out of the launcher's loop: its threads are joined, atexit handlers run, streams are flushed;
    then ``_exit_without_teardown``). Never returns."""
    code = 1
    try:
        listener.close()
        for conn in conns:
            conn.close()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        if request.get("watch"):  # started by tests/warm_command.py: stop when it dies
            _stop_when_closed(fds[3])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["refund-agent", *request["args"]]
        random.seed()
        if request.get("probe"):  # tests/test_launcher.py: what the command would have been given
            _probe(request["probe"])
            code = 0
        else:
            from agent.cli import main

            try:
                code = main(list(request["args"]))
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # the command's own crash: its traceback on its stderr, as a cold start would show it
        import traceback

        traceback.print_exc()
        code = 1
    global _exit_status
    _exit_status = code
    raise SystemExit(code)


def _stop_when_closed(fd: int) -> None:
    """Stop this command once every write end of the pipe ``fd`` reads from is closed (the process that asked for it
    died): SIGTERM, so a server stops what it started, then SIGKILL if it has not ended ten seconds later."""

    def watch() -> None:
        while os.read(fd, 1):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(10)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _probe(names: Sequence[str]) -> None:
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    seen = {name: (v.decode() if (v := libc.getenv(name.encode())) is not None else None) for name in names}
    print(json.dumps({"environ": dict(os.environ), "cwd": os.getcwd(), "getenv": seen}), flush=True)
    # On its way out a cold process joins the threads still running, then runs its exit handlers, then flushes what
    # they wrote; a forked one must too (``_exit_without_teardown``). Neither line below is flushed by its writer.
    finishing = threading.Event()
    threading.Thread(target=lambda: (finishing.wait(0.2), sys.stdout.write("a running thread finished\n"))).start()
    atexit.register(sys.stdout.write, "an exit handler ran\n")


def serve(path: str) -> None:
    """The launcher's loop: accept a request, fork it, report the pid; report each child's exit status."""
    _warm_up()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    parent = os.getppid()
    print("ready", flush=True)
    while True:
        for _ready in sel.select(timeout=0.05):
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, fds, listener, [*waiting.values(), conn])
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reported = waiting.pop(pid, None)
            if reported is not None:
                with contextlib.suppress(OSError):
                    reported.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                reported.close()
        if os.getppid() != parent:  # the test process is gone: so is the launcher
            os._exit(0)


# --- the test process's side -------------------------------------------------------------------------------------


class Launched(subprocess.Popen[bytes]):
    """A forked command as the ``subprocess.Popen`` a test holds: pid, poll, wait, signals, returncode."""

    def __init__(self, args: Sequence[str], pid: int, conn: socket.socket) -> None:  # no super(): nothing to start
        self.args = list(args)
        self.pid = pid
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._conn = conn
        self._lock = threading.Lock()

    def _read_status(self, timeout: float | None) -> bool:
        with self._lock:
            if self.returncode is not None:
                return True
            self._conn.settimeout(timeout)
            try:
                line = b""
                while not line.endswith(b"\n"):
                    chunk = self._conn.recv(64)
                    if not chunk:  # the launcher went away without word: the child's fate is unknown
                        self.returncode = -signal.SIGKILL
                        return True
                    line += chunk
            except (TimeoutError, BlockingIOError):
                return False
            self.returncode = int(line)
            self._conn.close()
            return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode  # type: ignore[no-any-return]

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[no-any-return]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        self.wait(timeout)
        return None, None

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()

    def __del__(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<Launched pid={self.pid} returncode={self.returncode} args={self.args!r}>"


class Launcher:
    """This test process's launcher: started on first use, ended with the process."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="ra-launcher-")
        self.path = os.path.join(self._dir, "sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", self.path],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the test launcher did not start: {ready!r}")

    def launch(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
        cwd: str | os.PathLike[str] | None = None,
        probe: Sequence[str] = (),
    ) -> Launched:
        """Fork ``refund-agent ARGS``; with ``probe``, a child that prints its environment, its directory and the C
        library's view of the ``probe`` variables instead (for tests of the launcher itself)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        request = {"args": list(args), "env": dict(env), "cwd": os.fspath(cwd or os.getcwd()), "probe": list(probe)}
        socket.send_fds(conn, [json.dumps(request).encode()], [stdin, stdout, stderr])
        line = read_line(conn)
        if line is None:
            raise RuntimeError("the test launcher closed the connection before forking")
        return Launched([sys.executable, *_CLI, *args], int(line), conn)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_launcher: Launcher | None = None
_launcher_lock = threading.Lock()


def launcher() -> Launcher | None:
    """This process's launcher, started on first use; None when commands start cold (``COLD_ENV``)."""
    global _launcher
    if os.environ.get(COLD_ENV) == "1":
        return None
    with _launcher_lock:
        if _launcher is None or _launcher.proc.poll() is not None:
            _launcher = Launcher()
        return _launcher


def close() -> None:
    global _launcher
    if _launcher is not None:
        _launcher.close()
        _launcher = None


def _fd(target: Any, default: int, opened: list[IO[bytes]]) -> int:
    if target is None:
        return default
    if target == subprocess.DEVNULL:
        devnull = open(os.devnull, "r+b")  # noqa: SIM115 - closed once the fd is sent
        opened.append(devnull)
        return devnull.fileno()
    if isinstance(target, int):
        return target
    return int(target.fileno())


class Subprocess:
    """The ``subprocess`` module as ``agent.ops.processes`` sees it in a test process: ``Popen`` of
    ``python -m agent.cli`` forks from the launcher; everything else is the real module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        warm = launcher()
        simple = set(kwargs) <= {"env", "stdout", "stderr", "stdin", "cwd"}
        if warm is None or not simple or tuple(args[1:3]) != _CLI or args[0] != sys.executable:
            return subprocess.Popen(args, **kwargs)
        opened: list[IO[bytes]] = []
        try:
            out = _fd(kwargs.get("stdout"), 1, opened)
            err = out if kwargs.get("stderr") == subprocess.STDOUT else _fd(kwargs.get("stderr"), 2, opened)
            return warm.launch(
                list(args[3:]),
                env=kwargs.get("env") or os.environ,
                stdin=_fd(kwargs.get("stdin"), 0, opened),
                stdout=out,
                stderr=err,
                cwd=kwargs.get("cwd"),
            )
        finally:
            for f in opened:
                f.close()


def install() -> None:
    """Route ``agent.ops.processes.spawn`` (the tests', the demo's, the chaos tools') through the launcher."""
    from agent.ops import processes

    processes.subprocess = Subprocess()  # type: ignore[attr-defined,assignment]


_shims: dict[str, Path] = {}


def command_dir() -> Path | None:
    """A directory holding a ``refund-agent`` that forks from this process's launcher (tests/warm_command.py), to
    put first on a PATH; None when commands start cold (``COLD_ENV``)."""
    warm = launcher()
    if warm is None:
        return None
    if warm.path not in _shims:
        here = Path(__file__).resolve().parent
        shim = Path(tempfile.mkdtemp(prefix="ra-command-")) / "refund-agent"
        shim.write_text(
            f"#!{sys.executable} -IS\n"
            "import sys\n"
            f"sys.path.insert(0, {str(here)!r})\n"
            "import warm_command\n"
            f"raise SystemExit(warm_command.main({warm.path!r}))\n"
        )
        shim.chmod(0o755)
        _shims[warm.path] = shim.parent
    return _shims[warm.path]


def cold_command() -> list[str]:
    """``python -m agent.cli``: the command line started cold, as the launcher never starts it."""
    return [sys.executable, *_CLI]


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, agent.cli, *args], capture_output=True, text=True)``, forked when warm."""
    command = [sys.executable, *_CLI, *args]
    warm = launcher()
    if warm is None:
        return subprocess.run(
            command, env=dict(env), cwd=cwd, timeout=timeout, input=input, capture_output=True, text=True
        )
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as given,
    ):
        if input is not None:
            given.write(input.encode())
            given.seek(0)
        proc = warm.launch(list(args), env=env, stdin=given.fileno(), stdout=out.fileno(), stderr=err.fileno(), cwd=cwd)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            command, proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )


if __name__ == "__main__":
    serve(sys.argv[1])
