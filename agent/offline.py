"""The deterministic offline model: used when no model is configured, and labelled as such everywhere."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandbox.claims import classify, tools_for

OFFLINE_MODEL_NAME = "offline model"

_ORDER = re.compile(r"Refund request for order (\S+)\.")
_ASKED = re.compile(r"Requested amount: ([0-9.]+)")
_MESSAGE = re.compile(r"<<<\n(.*)\n>>>", re.S)
_CASE = re.compile(r"^Case file \(JSON, from our systems\): (.*)$", re.M)
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,3})?(?![\w])")


def _prompt(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _first_group(pattern: re.Pattern[str], text: str) -> str:
    match = pattern.search(text)
    return match.group(1) if match else ""


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found[part.tool_name] = part.content
    return found


def _amount_from_text(message: str, refundable: Decimal) -> Decimal:
    """Read an amount the way a literal clerk would: a number, "half", else everything refundable."""
    if re.search(r"\bhalf\b", message, re.I):
        return (refundable / 2).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    match = _NUMBER.search(message)
    if match:
        try:
            return Decimal(match.group(1).replace(",", "") + (match.group(2) or ""))
        except InvalidOperation:
            pass
    return refundable


def _reply(verdict: dict[str, Any], amount: str, currency: str) -> str:
    kind = verdict.get("verdict")
    if kind == "auto_approve":
        return (
            f"Good news: we have approved a refund of {amount} {currency}. It will reach your original "
            "payment method within 5-10 business days."
        )
    if kind == "needs_approval":
        return (
            f"Thank you. Your refund of {amount} {currency} needs a quick review by our team; "
            "we will get back to you within 3 days."
        )
    if kind == "wait":
        return (
            "Thank you. We cannot refund this yet: what we can see says it is still on its way. "
            "We will let you know what happens next."
        )
    reasons = "; ".join(verdict.get("reasons", [])) or "it is outside our refund policy"
    return f"We are sorry, but we cannot refund this order: {reasons}."


def offline_model_function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """From the case file in the prompt: the look-ups the claim's category needs (all in one response), then one
    answer; with the look-up tools of refunds started before the case file (agent.legacy), their sequence."""
    if any(tool.name == "get_order" for tool in info.function_tools):
        return _legacy_function(messages, info)
    prompt = _prompt(messages)
    order_id = _first_group(_ORDER, prompt)
    case = json.loads(_first_group(_CASE, prompt) or "{}")
    message = _first_group(_MESSAGE, prompt)
    currency = case.get("currency") or "USD"
    refundable = Decimal(case.get("refundable_now") or "0")
    blockers = list(case.get("blockers") or [])
    category = classify(message)
    returns = _returns(messages)
    if blockers or refundable <= 0:
        amount = "0"
        verdict: dict[str, Any] = {"verdict": "refuse", "reasons": blockers or ["nothing is refundable"]}
        return _proposal(info, order_id, amount, currency, verdict, category)
    wanted_tools = [name for name in tools_for(message) if name not in returns]
    if wanted_tools and not returns:  # look first, every look-up at once: one more model request in all
        calls = [ToolCallPart(name, {"order_id": order_id}) for name in wanted_tools]
        return ModelResponse(parts=list(calls), model_name=OFFLINE_MODEL_NAME)
    asked = _first_group(_ASKED, prompt)
    wanted = Decimal(asked) if asked else _amount_from_text(message, refundable)
    received = _received(returns.get("check_return"))
    if received is not None:
        wanted = min(wanted, received)
    amount = str(wanted)
    if wanted > refundable:
        verdict = {"verdict": "refuse", "reasons": [f"at most {refundable} {currency} can be refunded"]}
    elif _evidence_waits(returns) or wanted <= 0:
        verdict = {"verdict": "wait"}
    elif wanted > Decimal(case.get("paid_without_review_up_to") or "0") or _evidence_disputes(returns):
        verdict = {"verdict": "needs_approval"}
    else:
        verdict = {"verdict": "auto_approve"}
    return _proposal(info, order_id, amount, currency, verdict, category)


def _received(found: Any) -> Decimal | None:
    """What the warehouse received on the order's return, when it received anything."""
    if not isinstance(found, dict) or found.get("status") not in ("received", "inspected"):
        return None
    return sum((Decimal(str(line["amount"])) for line in found.get("lines", []) if line.get("received")), Decimal(0))


def _evidence_waits(returns: dict[str, Any]) -> bool:
    """The evidence says not yet: the parcel is on its way, or nothing came back to the warehouse."""
    tracking, back = returns.get("track_shipment"), returns.get("check_return")
    moving = isinstance(tracking, dict) and tracking.get("status") in ("pre_transit", "in_transit", "out_for_delivery")
    waiting = isinstance(back, dict) and back.get("status") in ("none", "label_created", "in_transit")
    return moving or waiting


def _evidence_disputes(returns: dict[str, Any]) -> bool:
    """The evidence contradicts the claim, or could not be read: a person looks."""
    tracking = returns.get("track_shipment")
    delivered = isinstance(tracking, dict) and tracking.get("status") == "delivered"
    failed = any(isinstance(found, dict) and "error" in found for found in returns.values())
    return delivered or failed


def _legacy_function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = _prompt(messages)
    order_id = _first_group(_ORDER, prompt)
    returns = _returns(messages)
    if "get_order" not in returns:
        return ModelResponse(parts=[ToolCallPart("get_order", {"order_id": order_id})], model_name=OFFLINE_MODEL_NAME)
    order = returns["get_order"]
    if "error" in order:
        currency, amount, verdict = "USD", "0", {"verdict": "refuse", "reasons": [order["error"]]}
    else:
        if "get_refund_history" not in returns:
            return ModelResponse(parts=[ToolCallPart("get_refund_history", {})], model_name=OFFLINE_MODEL_NAME)
        currency = order["currency"]
        asked = _first_group(_ASKED, prompt)
        message = _first_group(_MESSAGE, prompt)
        wanted = Decimal(asked) if asked else _amount_from_text(message, Decimal(order["refundable_now"]))
        if "request_refund" not in returns:
            call = ToolCallPart("request_refund", {"amount": str(wanted)})
            return ModelResponse(parts=[call], model_name=OFFLINE_MODEL_NAME)
        verdict = returns["request_refund"]
        amount = str(wanted)
    return _proposal(info, order_id, amount, currency, verdict)


def _proposal(
    info: AgentInfo, order_id: str, amount: str, currency: str, verdict: dict[str, Any], category: str = "other"
) -> ModelResponse:
    output = {
        "category": category,
        "amount": amount,
        "currency": currency,
        "reason": f"Offline model: customer asked about order {order_id}; proposing {amount} {currency} "
        f"({verdict.get('verdict')}).",
        "customer_reply": _reply(verdict, amount, currency),
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, output)], model_name=OFFLINE_MODEL_NAME)


def offline_model() -> FunctionModel:
    return FunctionModel(offline_model_function, model_name=OFFLINE_MODEL_NAME)
