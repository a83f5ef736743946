"""ASGI apps under uvicorn in a thread, on a free loopback port: sandboxes, fakes and services in tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from agent.ops.processes import free_port


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
