"""What deciding a refund cost at the model: recorded with the refund, shown by the API, console and metrics."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from agent.offline import OFFLINE_MODEL_NAME
from agent.ops.processes import wait_for
from agent.settings import ModelPrice, Settings
from steps import audit
from steps.store import app_db, refunds
from tests.conftest import Env
from tests.console_server import API_TOKEN as TOKEN
from tests.console_server import console_server

PRICE = {"input_per_million": "2.50", "output_per_million": "10.00", "currency": "USD"}


def _submit(http: httpx.Client, key: str, order_id: str) -> None:
    response = http.post(
        "/refunds",
        json={"order_id": order_id, "message": "The mouse stopped working."},
        headers={"Idempotency-Key": key, "Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 202, response.text


def _finished(http: httpx.Client, key: str) -> dict[str, Any] | None:
    found: dict[str, Any] = http.get(f"/refunds/{key}", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return found if found["status"] in ("completed", "rejected") else None


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_a_price_turns_tokens_into_a_cost() -> None:
    price = ModelPrice.model_validate(PRICE)
    assert price.cost(1_000_000, 100_000) == Decimal("3.500000")
    assert price.cost(0, 0) == Decimal(0)
    prices = Settings(refund_agent_model_prices={"m": PRICE}).model.prices
    assert prices["m"].output_per_million == Decimal("10.00")


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_usage_per_refund_is_kept_and_shown_by_the_api_the_console_and_metrics(env: Env) -> None:
    prices = {OFFLINE_MODEL_NAME: PRICE}
    with console_server(env, refund_agent_model_prices=prices) as (server, _client):
        with server.signed_in("ada") as http:
            _submit(http, "usage-paid-0001", "ord_1001")
            _submit(http, "usage-refused-01", "ord_1004")  # disputed: refused, and its model request still counts
            paid = wait_for(lambda: _finished(http, "usage-paid-0001"), timeout=60, what="the refund to complete")
            refused = wait_for(lambda: _finished(http, "usage-refused-01"), timeout=60, what="the refusal")
            page = http.get("/console/refunds/usage-paid-0001").text
            scraped = http.get("/metrics").text
        with app_db().engine.connect() as conn:
            rows = {
                r.refund_id: r
                for r in conn.execute(
                    sa.select(
                        refunds.c.refund_id, refunds.c.model_requests, refunds.c.input_tokens, refunds.c.output_tokens
                    )
                )
            }
            proposed = [e for e in audit.entries(conn, "usage-paid-0001") if e.event == "agent_proposed"]
    row = rows["usage-paid-0001"]
    assert row.model_requests == 1 and row.input_tokens > 0 and row.output_tokens > 0
    usage = paid["usage"]
    assert (usage["model"], usage["requests"]) == (OFFLINE_MODEL_NAME, 1)
    assert (usage["input_tokens"], usage["output_tokens"]) == (row.input_tokens, row.output_tokens)
    cost = ModelPrice.model_validate(PRICE).cost(row.input_tokens, row.output_tokens)
    assert usage["cost"] == {"amount": str(cost), "currency": "USD"}
    assert refused["usage"]["requests"] == 1
    assert proposed[0].payload["usage"]["input_tokens"] == row.input_tokens  # in the tamper-evident log too
    shown = re.search(r'id="usage">([^<]*)<', page)
    assert shown is not None
    assert shown.group(1) == (f"1 request, {row.input_tokens} tokens in, {row.output_tokens} out, cost {cost} USD")
    label = f'model="{OFFLINE_MODEL_NAME}"'
    assert _metric(scraped, f"refund_agent_model_requests_total{{{label}}}") == 2
    both_in = sum(r.input_tokens for r in rows.values())
    assert _metric(scraped, f'refund_agent_model_tokens_total{{kind="input",{label}}}') == both_in
    both_out = sum(r.output_tokens for r in rows.values())
    total_cost = ModelPrice.model_validate(PRICE).cost(both_in, both_out)
    assert _metric(scraped, f'refund_agent_model_cost_total{{currency="USD",{label}}}') == pytest.approx(
        float(total_cost)
    )
