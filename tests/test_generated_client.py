"""A client generated from the running service's OpenAPI document works: ``openapi-python-client`` (the dev extra)
generates it from a live `refund-agent serve`'s ``/openapi.json`` without a warning, and it submits, follows,
lists and approves refunds with the bearer key the document declares, parsing every answer it meets into the
document's models. ``raise_on_unexpected_status``: a status the document does not list fails the test."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent.ops.processes import wait_for
from tests.conftest import Env
from tests.live import LiveService, live_service

BIN = Path(sys.executable).parent
PACKAGE = "refund_agent_client"


def generate(svc: LiveService, into: Path) -> str:
    """Run the generator as the docs show it (docs/api.md), against the service's address; its output."""
    made = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--url",
            f"{svc.base}/openapi.json",
            "--output-path",
            str(into / PACKAGE),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},  # it formats with ruff
        check=False,
    )
    output = made.stdout + made.stderr
    assert made.returncode == 0, output
    return output


@contextmanager
def imported(into: Path) -> Iterator[Any]:
    """The generated package, importable while the block runs."""
    sys.path.insert(0, str(into))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(into))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def operation(tag: str, name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)  # the document is the same code on Postgres
def test_a_generated_client_submits_follows_lists_and_approves_refunds(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, _):
        output = generate(svc, tmp_path)
        assert "Warning" not in output, output  # the generator warns of each part of the document it cannot use
        with imported(tmp_path) as package:
            models = importlib.import_module(f"{PACKAGE}.models")
            create_refund, get_refund = operation("refunds", "create_refund"), operation("refunds", "get_refund")
            list_refunds, post_decision = operation("refunds", "list_refunds"), operation("approvals", "post_decision")
            get_orders = operation("orders", "get_orders")

            def as_client(key: str) -> Any:
                return package.AuthenticatedClient(base_url=svc.base, token=key, raise_on_unexpected_status=True)

            helpdesk, approver = as_client(svc.keys.api_token), as_client(svc.keys.approver_key)
            anonymous = package.Client(base_url=svc.base, raise_on_unexpected_status=True)

            def submit(client: Any, key: str, order_id: str, **fields: Any) -> Any:
                body = models.RefundIn(order_id=order_id, message="It arrived broken.", **fields)
                return create_refund.sync_detailed(client=client, body=body, idempotency_key=key)

            def refund(client: Any, refund_id: str) -> Any:
                return get_refund.sync(client=client, refund_id=refund_id)

            def reaches(client: Any, refund_id: str, status: str) -> Any:
                def there() -> Any:
                    found = refund(client, refund_id)
                    return found if str(found.status) == status else None

                return wait_for(there, timeout=90, what=f"{refund_id} to be {status}", interval=0.2)

            # A refund paid at once, in a lower-case currency; the same request again is the same refund (200).
            paid = submit(helpdesk, "generated-paid-1", "ord_1001", amount="42.00", currency="usd")
            assert paid.status_code == 202 and isinstance(paid.parsed, models.Accepted), paid.content
            assert paid.parsed.refund_id == "generated-paid-1"
            again = submit(helpdesk, "generated-paid-1", "ord_1001", amount="42.00", currency="USD")
            assert again.status_code == 200 and again.parsed.refund_id == "generated-paid-1"
            done = reaches(helpdesk, "generated-paid-1", "completed")
            assert (done.amount, done.currency) == ("42.00", "USD")
            assert (done.amount_requested, done.amount_refunded) == ("42.00", "42.00")  # asked and paid, named
            assert done.payment.provider_refund_id == env.sandbox.refunds("ch_ord_1001")[0]["id"]

            # A big refund waits for a person; the approvals desk approves it through the client.
            assert submit(helpdesk, "generated-big-01", "ord_1002").status_code == 202
            waiting = reaches(approver, "generated-big-01", "awaiting_approval")
            asked = waiting.approval.request.amount
            decision = models.DecisionIn(decision=models.DecisionInDecision("approve"), currency="usd")
            decided = post_decision.sync_detailed(client=approver, refund_id="generated-big-01", body=decision)
            assert decided.status_code == 200 and isinstance(decided.parsed, models.DecisionView), decided.content
            assert (decided.parsed.amount, decided.parsed.first) == (asked, True)
            assert reaches(approver, "generated-big-01", "completed").approval.approver == "client:approvals-desk"

            listed = list_refunds.sync(client=approver, limit=10)
            assert sorted(item.refund_id for item in listed.items) == ["generated-big-01", "generated-paid-1"]
            big = next(item for item in listed.items if item.refund_id == "generated-big-01")
            assert (big.amount_requested, big.amount_refunded) == (None, asked)  # no amount named; paid in full
            orders = get_orders.sync(client=helpdesk, limit=100)
            assert {o.order_id: o.refundable for o in orders.items}["ord_1001"] == "0.00"

            # Refusals arrive as the document's problem details, each status declared.
            refusals = {
                401: submit(anonymous, "generated-anon-1", "ord_1001"),
                404: submit(helpdesk, "generated-none-1", "ord_nope"),
                409: submit(helpdesk, "generated-paid-1", "ord_1001", amount="1.00"),
                422: submit(helpdesk, "generated-bad-01", "ord_1001", amount="1e3"),
            }
            for status, answer in refusals.items():
                assert answer.status_code == status and isinstance(answer.parsed, models.ProblemDetails), answer.content
                assert answer.parsed.status == status and answer.parsed.detail
            unknown = post_decision.sync_detailed(client=approver, refund_id="generated-none-1", body=decision)
            assert unknown.status_code == 404 and unknown.parsed.detail == "there is no refund generated-none-1"
            requester = post_decision.sync_detailed(client=helpdesk, refund_id="generated-big-01", body=decision)
            assert requester.status_code == 403 and isinstance(requester.parsed, models.ProblemDetails)
            missing = refund(helpdesk, "generated-none-1")
            assert missing.status == 404
