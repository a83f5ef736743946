"""Starting and watching the service's own processes (the demo and the crash tests use these)."""

from __future__ import annotations

import functools
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
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


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's verifying TLS context, built once: each build reads the CA bundle, and readiness is polled often."""
    return httpx.create_ssl_context()


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, verify=_tls()).status_code == 200
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
