"""A local HTTP endpoint that records what is posted to it (a stand-in for Slack's webhooks)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

from agent.processes import free_port


class CaptureServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.posts: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/{path:path}")
        async def record(path: str, request: Request) -> dict[str, bool]:
            with self.lock:
                self.posts.append((path, await request.json()))
            return {"ok": True}

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def received(self, path: str) -> list[Any]:
        with self.lock:
            return [body for p, body in self.posts if p == path]

    def __enter__(self) -> CaptureServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("capture server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
