"""The Slack stand-in keeps answering while one post's body is still on its way (two approver messages at once)."""

from __future__ import annotations

import socket

from agent.ops.processes import wait_for
from tests import web
from tests.capture import CaptureServer


def test_capture_server_records_a_post_while_another_body_is_still_arriving() -> None:
    with CaptureServer() as capture:
        body = b'{"text": "slow"}'
        with socket.create_connection(("127.0.0.1", capture.port)) as slow:
            head = "POST /webhook HTTP/1.1\r\nHost: capture\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {len(body)}\r\n\r\n"
            slow.sendall(head.encode())
            wait_for(lambda: len(capture.server.server_state.tasks) >= 1 or None, timeout=10, what="the slow post")
            answer = web.post(capture.url("webhook"), json={"text": "fast"}, timeout=10)
            assert answer.status_code == 200
            slow.sendall(body)
            received = wait_for(
                lambda: capture.received("webhook") if len(capture.received("webhook")) == 2 else None,
                timeout=10,
                what="both posts",
            )
        assert received == [{"text": "fast"}, {"text": "slow"}]
