"""A local HTTP endpoint that records what is posted to it (a stand-in for Slack's webhooks)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI, Request

from tests.servers import ThreadedServer


class CaptureServer(ThreadedServer):
    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/{path:path}")
        async def record(path: str, request: Request) -> dict[str, bool]:
            body = await request.json()  # never await while holding the lock: a second post would block the loop
            with self.lock:
                self.posts.append((path, body))
            return {"ok": True}

        super().__init__(app)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def received(self, path: str) -> list[Any]:
        with self.lock:
            return [body for p, body in self.posts if p == path]

    def __enter__(self) -> CaptureServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
