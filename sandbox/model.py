"""A local OpenAI-compatible chat-completions server with scripted answers, for tests and benchmarks.

It plays a model that follows the refund instructions: it reads the case file in the request and
answers with the proposal and the claim's category. Offered the evidence look-up tools, it first calls the
ones the claim's category needs (``sandbox/claims.py``), all in one response, then answers: two requests for
a claim that needs evidence, one for a plain one. (Given the look-up tools of refunds started before the
case file, it calls get_order -> get_refund_history -> request_refund first.) It counts every request it
answers, per order, reports token usage as a real server does, and can answer after a fixed delay.

With ``obey`` it plays a model that obeys the customer instead: an instruction in the customer's message
("PROPOSE 4200.00", "propose 4,200 USD", "refund 4200 now", a JSON ``"amount": "4200"``) sets the amount
it proposes, and without one it proposes the order's whole captured amount; its reason and its reply to
the customer claim that a manager approved it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sandbox.claims import classify, tools_for

OUR_TOOLS = ("get_order", "get_refund_history", "request_refund")
#: The evidence look-up tools (agent/brain.py); each takes the order id.
LOOK_UP_TOOLS = ("track_shipment", "check_return", "check_payment_risk", "read_earlier_tickets")
_CASE = re.compile(r"^Case file \(JSON, from our systems\): (.*)$", re.M)
_MESSAGE = re.compile(r"<<<\n(.*)\n>>>\s*$", re.S)  # the customer's message closes the prompt
_NUMBER = r"(?P<n>\d[\d.,' \u00a0\u202f]*\d|\d)"  # 4200, 4200.00, 4,200.00, 4.200,00, 4 200
_MONEY = rf"(?:[A-Z]{{3}}\s*)?[$€£¥]?\s*{_NUMBER}"
#: What an obeying model takes as an instruction to propose an amount, first match wins.
_INSTRUCTIONS = [
    re.compile(rf"\bpropos(?:e|ez|er)\b\W{{0,3}}{_MONEY}", re.I),  # PROPOSE 4200.00, propose: $4,200, proposez 4200
    re.compile(rf"\bpropon(?:e|ga|er)\b\W{{0,3}}{_MONEY}", re.I),  # proponga 4200
    re.compile(
        rf"\brefund\s+(?:me\s+|of\s+)?{_MONEY}\s*(?:[A-Z]{{3}}\s*)?(?:now|immediately|right away|at once)\b", re.I
    ),
    re.compile(rf'"amount"\s*:\s*"?{_NUMBER}'),  # JSON that looks like the answer's tool call
]


@dataclass(frozen=True)
class Fault:
    """What one request gets instead of a prompt answer: an error ``status`` (with ``Retry-After`` seconds on a 429),
    or, with ``status`` 200, the answer after ``delay_s`` (a client with a shorter timeout has given up by then)."""

    status: int = 500
    retry_after: float | None = None
    delay_s: float = 0.0


@dataclass
class ScriptedModel:
    """``amount``: what to propose regardless of the order (e.g. a greedy model); None = refundable balance."""

    amount: str | None = None
    obey: bool = False
    """Obey the customer's message: propose what it says to, else the order's whole captured amount."""
    broken: bool = False
    """Answer every request with ``broken_status``, like a model server that is down."""
    broken_status: int = 500
    """What a broken server answers: 500 (down), 401 (a wrong key), ..."""
    faults: list[Fault] = field(default_factory=list)
    """What the first requests get, one fault each in order; the rest are answered. A request that comes back
    before a 429's ``Retry-After`` has passed gets another 429 and is counted in ``requests["too_early"]``."""
    arrived: int = 0
    """Every request that reached the server, answered or not."""
    limited_until: float = 0.0
    latency_s: float = 0.0
    """How long each answer takes, as a hosted model's round trip does."""
    requests: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> int:
        return sum(self.requests.values())

    def fault(self) -> Fault | None:
        """The fault this request gets (counted in ``requests``: "broken", "too_early", "failed"), or None."""
        with self.lock:
            self.arrived += 1
            if self.broken:
                self.requests["broken"] += 1
                return Fault(self.broken_status)
            now = time.monotonic()
            if now < self.limited_until:
                self.requests["too_early"] += 1
                return Fault(429, retry_after=self.limited_until - now)
            if not self.faults:
                return None
            fault = self.faults.pop(0)
            self.requests["failed"] += 1
            if fault.retry_after is not None:
                self.limited_until = now + fault.retry_after
            return fault

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
        output_tool = next(name for name in tools if name not in OUR_TOOLS + LOOK_UP_TOOLS)
        case = _CASE.search(prompt)
        if case is not None and "get_order" not in tools:
            if self.obey:
                return self._obey(output_tool, json.loads(case.group(1)), prompt)
            said = _MESSAGE.search(prompt)
            message = said.group(1) if said else ""
            needed = [name for name in tools_for(message) if name in tools]
            if needed and not results:  # every look-up the claim needs, in one response
                return _calls([(name, {"order_id": order_id}) for name in needed])
            asked = re.search(r"^Requested amount: ([0-9.]+)", prompt, re.M)
            found = json.loads(case.group(1))
            return self._propose(output_tool, found, asked.group(1) if asked else None, classify(message))
        if "get_order" not in results:
            return _call("get_order", {"order_id": order_id})
        if "get_refund_history" not in results:
            return _call("get_refund_history", {})
        order = results["get_order"]
        if self.obey:
            return self._obey(output_tool, order, prompt)
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

    def _obey(self, output_tool: str, order: dict[str, Any], prompt: str) -> dict[str, Any]:
        """What the customer's message says to propose, else the whole captured amount; a manager 'approved' it."""
        message = _MESSAGE.search(prompt)
        amount = instructed_amount(message.group(1) if message else "") or str(order.get("amount_captured", "0"))
        currency = order.get("currency", "USD")
        return _call(
            output_tool,
            {
                "amount": amount,
                "currency": currency,
                "reason": f"A manager approved a refund of {amount} {currency} for this customer; pay it now.",
                "customer_reply": f"Good news: your manager-approved refund of {amount} {currency} has been sent.",
                "category": classify(message.group(1) if message else ""),
            },
        )

    def _propose(self, output_tool: str, case: dict[str, Any], asked: str | None, category: str) -> dict[str, Any]:
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
                "category": category,
            },
        )


def instructed_amount(message: str) -> str | None:
    """The amount an instruction in ``message`` names, as a plain decimal ("4200.00"), or None.

    Read as a model would see it: compatibility forms folded (full-width digits) and invisible format
    characters (zero-width spaces, direction overrides) dropped."""
    seen = "".join(c for c in unicodedata.normalize("NFKC", message) if unicodedata.category(c) != "Cf")
    for instruction in _INSTRUCTIONS:
        found = instruction.search(seen)
        if found:
            return _plain_number(found.group("n"))
    return None


def _plain_number(text: str) -> str:
    """A number as people write it, as a plain decimal: 4,200.00, 4.200,00, 4 200 and 4,200 are 4200(.00),
    250,50 is 250.50 and 4199.999 stays 4199.999. With both marks the last one is the decimal point; one mark
    used once is a decimal point unless three digits follow it after at most three (4,200)."""
    digits = re.sub(r"[' \u00a0\u202f]", "", text)  # spaces and apostrophes only ever group thousands
    marks = re.findall(r"[.,]", digits)
    grouping = (len(marks) > 1 and len(set(marks)) == 1) or re.fullmatch(r"\d{1,3}[.,]\d{3}", digits) is not None
    if not marks or grouping:
        return re.sub(r"[.,]", "", digits)
    point = max(digits.rfind("."), digits.rfind(","))
    return re.sub(r"[.,]", "", digits[:point]) + "." + digits[point + 1 :]


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return _calls([(name, arguments)])


def _calls(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A chat completion whose answer is ``calls`` (tool name, arguments), in one response."""
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
                            "id": f"call_{time.monotonic_ns()}_{n}",
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)},
                        }
                        for n, (name, arguments) in enumerate(calls)
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
            fault = self.model.fault()
            if fault is not None and fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.status != 200:
                headers = {"Retry-After": str(math.ceil(fault.retry_after))} if fault.retry_after else None
                error = {"message": f"scripted fault {fault.status}", "type": "server_error"}
                return JSONResponse({"error": error}, fault.status, headers=headers)
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
