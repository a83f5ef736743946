"""``refund-agent`` as a command on PATH that forks from the suite's warm launcher (tests/zygote.py) instead of
starting cold: the docs tests type the docs' lines into bash, and this is the ``refund-agent`` bash finds there.

It hands the launcher its arguments, environment, directory and standard streams, passes on the signals a shell
or a test sends (TERM, INT, HUP, QUIT), and exits as the command did (killed by a signal: by the same signal). It
also hands over the read end of a pipe it holds open: if this process dies without word (SIGKILL), the command sees
the pipe close and stops itself, as a cold one in the same process group would have been stopped. Standard
library only, started with ``python -IS``: it costs milliseconds, not the command line's imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def read_line(conn: socket.socket) -> str | None:
    """One line the launcher sent (a pid or an exit status); None if it closed the connection first."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            return None
        line += chunk
    return line.decode()


def _line(conn: socket.socket) -> str:
    line = read_line(conn)
    if line is None:
        raise SystemExit("refund-agent: the suite's launcher went away")
    return line


def main(launcher: str) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(launcher)
    watch, _held = os.pipe()  # the write end stays open in this process only (not inheritable) until it exits
    request = {"args": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "watch": True}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2, watch])
    os.close(watch)
    pid = int(_line(conn))

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = int(_line(conn))
    if code < 0:  # killed by a signal: so is this process, for the shell's $? and the test's returncode
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code
