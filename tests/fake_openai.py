"""A local OpenAI-compatible chat-completions server with scripted tool-calling answers.

It plays a model that follows the refund instructions (get_order -> get_refund_history ->
request_refund -> final answer) and counts every request it answers, per order.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.servers import ThreadedServer

OUR_TOOLS = ("get_order", "get_refund_history", "request_refund")


@dataclass
class ScriptedModel:
    """``amount``: what to propose regardless of the order (e.g. a greedy model); None = refundable balance."""

    amount: str | None = None
    broken: bool = False
    """Answer every request with a 500, like a model server that is down."""
    requests: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> int:
        return sum(self.requests.values())

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        prompt = prompt if isinstance(prompt, str) else " ".join(p.get("text", "") for p in prompt)
        order_id = re.search(r"order (\S+)\.", prompt).group(1)  # type: ignore[union-attr]
        with self.lock:
            self.requests[order_id] += 1
        calls = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
        results: dict[str, Any] = {}
        for message in messages:
            for call in message.get("tool_calls") or []:
                if call["id"] in calls:
                    content = calls[call["id"]]["content"]
                    results[call["function"]["name"]] = json.loads(content) if content.startswith("{") else content
        output_tool = next(
            t["function"]["name"] for t in body.get("tools", []) if t["function"]["name"] not in OUR_TOOLS
        )
        if "get_order" not in results:
            return _call("get_order", {"order_id": order_id})
        if "get_refund_history" not in results:
            return _call("get_refund_history", {})
        order = results["get_order"]
        amount = self.amount or order.get("refundable_now", "0")
        if "request_refund" not in results:
            return _call("request_refund", {"amount": amount})
        verdict = results["request_refund"]
        return _call(
            output_tool,
            {
                "amount": amount,
                "currency": order.get("currency", "USD"),
                "reason": f"Scripted model proposes {amount} ({verdict['verdict']}).",
                "customer_reply": f"We have received your request for {amount} {order.get('currency')}.",
            },
        )


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{time.monotonic_ns()}",
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    }


class FakeOpenAIServer(ThreadedServer):
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        app = FastAPI()

        @app.post("/v1/chat/completions", response_model=None)
        async def completions(request: Request) -> dict[str, Any] | JSONResponse:
            if self.model.broken:
                with self.model.lock:
                    self.model.requests["broken"] += 1
                return JSONResponse({"error": {"message": "model server down", "type": "server_error"}}, 500)
            return self.model.answer(await request.json())

        super().__init__(app)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
