"""ASGI apps under uvicorn in a thread, on a free loopback port: sandboxes, fakes and services in tests."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from agent.ops.processes import free_port


def reserve_port() -> socket.socket:
    """A listening loopback socket on a free port, for a port that must stay this test's while servers come and go
    on it (one a provider redirects to): a port only chosen, not held, can be taken by the suite's other workers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen(64)
    return sock


class ThreadedServer:
    def __init__(self, app: Any, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:  # set once the app's lifespan startup has finished
            assert self.thread.is_alive(), "the server exited during startup (see the log above)"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the server did not shut down"
