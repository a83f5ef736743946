"""ASGI apps under uvicorn in a thread, on a free loopback port: sandboxes, fakes and services in tests."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from agent.ops.processes import free_port


def bound_socket() -> socket.socket:
    """A loopback socket bound to a free port, for a server to serve on: the port is this test's from now on, where a
    port only chosen is free until something binds it, and another worker's server can take it first."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", free_port()))
    return sock


def reserve_port() -> socket.socket:
    """A listening loopback socket on a free port, for a port that must stay this test's while servers come and go
    on it (one a provider redirects to)."""
    sock = bound_socket()
    sock.listen(64)
    return sock


class ThreadedServer:
    """An app under uvicorn in a thread, serving on ``sock`` (closed when it stops), or on a socket bound here."""

    def __init__(self, app: Any, *, sock: socket.socket | None = None) -> None:
        self.serve_on(uvicorn.Config(app, host="127.0.0.1", log_level="warning"), sock or bound_socket())

    def serve_on(self, config: uvicorn.Config, sock: socket.socket) -> None:
        """Serve ``config``'s app on ``sock`` (for a subclass that makes its own config)."""
        self.socket = sock
        self.port = int(sock.getsockname()[1])
        config.port = self.port
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

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
        self.socket.close()
