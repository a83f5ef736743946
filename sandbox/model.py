"""A local OpenAI-compatible chat-completions server with scripted answers, for tests and benchmarks.

It plays a model that follows the refund instructions: it reads the case file in the request and
answers with the proposal in one request (given the look-up tools of refunds started before the case
file, it calls get_order -> get_refund_history -> request_refund first). It counts every request it
answers, per order, reports token usage as a real server does, and can answer after a fixed delay.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

OUR_TOOLS = ("get_order", "get_refund_history", "request_refund")
_CASE = re.compile(r"^Case file \(JSON, from our systems\): (.*)$", re.M)


@dataclass
class ScriptedModel:
    """``amount``: what to propose regardless of the order (e.g. a greedy model); None = refundable balance."""

    amount: str | None = None
    broken: bool = False
    """Answer every request with a 500, like a model server that is down."""
    latency_s: float = 0.0
    """How long each answer takes, as a hosted model's round trip does."""
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
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        output_tool = next(name for name in tools if name not in OUR_TOOLS)
        case = _CASE.search(prompt)
        if case is not None and "get_order" not in tools:
            asked = re.search(r"^Requested amount: ([0-9.]+)", prompt, re.M)
            return self._propose(output_tool, json.loads(case.group(1)), asked.group(1) if asked else None)
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

    def _propose(self, output_tool: str, case: dict[str, Any], asked: str | None) -> dict[str, Any]:
        """What was asked, at most what is refundable (an honest model); ``amount`` overrides both."""
        refundable = case.get("refundable_now", "0")
        fits = asked is not None and float(asked) <= float(refundable)
        amount = self.amount or (asked if fits else refundable)
        currency = case.get("currency", "USD")
        return _call(
            output_tool,
            {
                "amount": amount,
                "currency": currency,
                "reason": f"Scripted model proposes {amount} (up to {case.get('paid_without_review_up_to')} at once).",
                "customer_reply": f"We have received your request for {amount} {currency}.",
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeOpenAIServer:
    """The scripted model served over HTTP on 127.0.0.1, in a thread of this process."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        app = FastAPI()

        @app.post("/v1/chat/completions", response_model=None)
        async def completions(request: Request) -> dict[str, Any] | JSONResponse:
            if self.model.latency_s:
                await asyncio.sleep(self.model.latency_s)
            if self.model.broken:
                with self.model.lock:
                    self.model.requests["broken"] += 1
                return JSONResponse({"error": {"message": "model server down", "type": "server_error"}}, 500)
            return self.model.answer(await request.json())

        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the model server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
