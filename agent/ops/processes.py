"""Starting and watching the service's own processes (the demo and the crash tests use these)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from steps.tls import client_context

T = TypeVar("T")
_random = random.SystemRandom()  # not seeded by tests or libraries that seed `random`


#: Where ``free_port`` looks: below Linux's default ephemeral range (32768-60999), which the kernel hands out both to
#: ``bind(port 0)`` and as the source port of every outgoing connection. A port found free there stays free until
#: the process it is for binds it, unless another caller of ``free_port`` drew the same number.
_PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port free now, for a process or server about to bind it."""
    for _ in range(200):
        port = _random.choice(_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # the range is crowded: any port the kernel gives
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(overrides: Mapping[str, str], *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without ``drop``, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(overrides)
    return env


def spawn(args: list[str], *, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Run ``refund-agent ARGS`` as a child process (environment exactly ``env``), output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agent.cli", *args],
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``check`` until it returns something other than None/False, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, verify=client_context()).status_code == 200
    except httpx.HTTPError:
        return False


def stop(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
