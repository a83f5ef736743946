"""What a real `refund-agent serve` answers to requests it refuses: who may act is settled before what was sent
is judged, every malformed amount says what is wrong with it, library wording never reaches a client, methods
the API does not have are 405, and a currency code in any case is the same currency (documented, as Stripe
takes ISO codes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from steps import clients
from steps.store import app_db
from tests.conftest import Env
from tests.live import LiveService, live_service

ADMIN_KEY = "test-key-of-the-desk-admin-client-01"


@pytest.fixture(scope="module")
def svc(module_env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One live service per backend for the module: each test uses its own idempotency keys, and the one that pays
    ord_1001 comes after those that are refused amounts against its balance."""
    with live_service(module_env, tmp_path_factory.mktemp("live")) as (service, _):
        yield service


def test_deciding_an_unknown_refund_is_404_and_the_requester_is_403_whatever_its_body(svc: LiveService) -> None:
    unknown = svc.decide("no-such-refund-01", "approve", "10.00")
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["detail"] == "there is no refund no-such-refund-01"
    # A client that may do everything (admin) and requested the refund still never decides it: 403, even for a
    # body that also breaks a rule (no currency), and even for a body that is right.
    clients.add_client(app_db().engine, name="desk-admin", scopes=["admin"], key=ADMIN_KEY)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"order_id": "ord_1002", "message": "It arrived broken."}
    accepted = svc.http.post("/refunds", json=body, headers={**admin, "Idempotency-Key": "admin-asked-01"})
    assert accepted.status_code == 202, accepted.text
    for decision in ({"decision": "approve"}, {"decision": "approve", "currency": "USD"}, {"bogus": 1}):
        mine = svc.http.post("/refunds/admin-asked-01/approval", json=decision, headers=admin)
        assert mine.status_code == 403, (decision, mine.text)
        assert "the requester cannot decide it" in mine.json()["detail"]
    # Without the scope to decide, the scope is what is missing, whatever the body.
    helpdesk = svc.http.post("/refunds/admin-asked-01/approval", json={"decision": "approve"}, headers=svc.auth)
    assert helpdesk.status_code == 403 and "approvals:decide" in helpdesk.json()["detail"]


#: Each malformed amount, and the words that say what is wrong with it.
AMOUNTS: dict[object, str] = {
    "1e3": 'amount must be written out in digits, without an exponent ("1000.00", not "1e3")',
    "-1": "amount must be more than 0: a refund is never negative",
    "NaN": "amount must be a finite number of money, not 'NaN'",
    "Infinity": "amount must be a finite number of money, not 'Infinity'",
    12.5: 'amount must be a decimal string such as "42.50", not the JSON value 12.5',
    True: 'amount must be a decimal string such as "42.50", not the JSON value true',
    "0": "amount must be greater than zero",
    "": "amount is empty: leave it out (or null) for the whole refundable balance",
    " 42.00": 'amount must be the number alone, without spaces around it ("42.50")',
    "٤٢": 'amount must be written with the ASCII digits 0-9 ("42.50")',
    "+5": 'amount takes no sign: write the digits alone ("42.50")',
    "1,000.00": 'amount takes no thousands separators and marks decimals with a point ("1234.50")',
    "4x": 'amount must be a decimal string such as "42.50": digits, then optionally a point and decimals',
    "42.": 'amount must be a decimal string such as "42.50": digits, then optionally a point and decimals',
    "1234567890123": "amount is too large: at most 12 digits before the decimal point",
    "1.2345": "amount has 4 decimal places; no supported currency has more than 3",
}
#: Amounts well formed but wrong for the order (read from it): said as the order's rule, not the field's.
FOR_THE_ORDER: dict[object, str] = {
    "1.005": "amount 1.005 is finer than USD allows: USD has 2 decimal places",
    "50.00": "amount 50.00 is more than the 42.00 paid",
}


def test_each_malformed_amount_is_answered_with_what_is_wrong_with_it(svc: LiveService) -> None:
    before = svc.refund_rows()
    details: dict[object, str] = {}
    for number, amount in enumerate([*AMOUNTS, *FOR_THE_ORDER]):
        body = {"order_id": "ord_1001", "message": "It broke.", "amount": amount}
        headers = {**svc.auth, "Idempotency-Key": f"amount-{number:04d}"}
        answer = svc.http.post("/refunds", json=body, headers=headers)
        assert answer.status_code == 422, (amount, answer.text)
        details[amount] = answer.json()["detail"]
    expected: dict[object, str] = {amount: f"amount: {words}" for amount, words in AMOUNTS.items()}
    assert details == {**expected, **FOR_THE_ORDER}
    assert len(set(details.values())) == len(details) - 1  # "4x" and "42." share the rule of the shape
    assert svc.refund_rows() == before  # none of them started a refund


@pytest.mark.parametrize("module_env", ["sqlite"], indirect=True)  # the words are the same code on Postgres
def test_no_library_wording_reaches_a_client(svc: LiveService) -> None:
    refusals = [
        {"order_id": "ord_1001", "message": "x", "currency": "XYZ"},
        {"order_id": "ord_1001", "message": "x", "currency": "U5D"},
        {"order_id": "ord_1001", "message": "   "},
        {"order_id": "ord 1001", "message": "x"},
        {"order_id": "ord_1001", "message": "x", "amount": "0.00"},
    ]
    details = []
    for number, body in enumerate(refusals):
        headers = {**svc.auth, "Idempotency-Key": f"words-{number:04d}"}
        answer = svc.http.post("/refunds", json=body, headers=headers)
        assert answer.status_code == 422, (body, answer.text)
        details.append(answer.json()["detail"])
    assert not [d for d in details if "Value error" in d or "Assertion failed" in d], details
    assert details[0] == "currency: unsupported currency 'XYZ'; supported: USD, EUR, GBP, CHF, JPY, KWD"
    assert details[1] == 'currency: currency must be a three-letter ISO 4217 code such as "USD"'
    assert details[2] == "message: message must not be empty"


@pytest.mark.parametrize("module_env", ["sqlite"], indirect=True)
def test_methods_the_api_lacks_are_405_and_bodies_are_judged_by_what_the_route_takes(svc: LiveService) -> None:
    for method in ("PUT", "PATCH", "DELETE"):
        bare = svc.http.request(method, "/refunds", headers=svc.auth)
        assert bare.status_code == 405, (method, bare.text)
        assert bare.headers["allow"] == "GET, POST"
        with_form = svc.http.request(method, "/refunds", headers=svc.auth, data={"order_id": "ord_1001"})
        assert with_form.status_code == 405, (method, with_form.text)
    headers = {**svc.auth, "Idempotency-Key": "no-body-00001"}
    form = svc.http.post("/refunds", data={"order_id": "ord_1001", "message": "It broke."}, headers=headers)
    assert form.status_code == 415, form.text
    assert form.json()["detail"] == "this endpoint takes a body of type application/json"
    empty = svc.http.post("/refunds", headers=headers)
    assert empty.status_code == 422, empty.text
    assert empty.json()["detail"] == "a JSON body is required (Content-Type: application/json)"
    # No Idempotency-Key is 400 whatever else is wrong with the request.
    keyless = svc.http.post("/refunds", json={"order_id": "ord_1001", "amount": 5}, headers=svc.auth)
    assert keyless.status_code == 400 and keyless.json()["detail"] == "the Idempotency-Key header is required"
    # The approval link's page takes its form: a JSON body there is refused naming the form type.
    link = svc.http.post("/approve/whatever", json={"decision": "approve"})
    assert link.status_code == 415 and "application/x-www-form-urlencoded" in link.json()["detail"]


def test_a_currency_code_in_any_case_is_that_currency(svc: LiveService) -> None:
    lower = svc.submit("lower-case-usd1", "ord_1001", message="It broke.", currency="usd")
    assert lower.status_code == 202, lower.text
    refund = svc.until("lower-case-usd1", "completed")
    assert refund["currency"] == "USD" and refund["amount"] == "42.00"
    # The same request: the same refund, not a conflict over the spelling of its currency.
    upper = svc.submit("lower-case-usd1", "ord_1001", message="It broke.", currency="USD")
    assert upper.status_code == 200, upper.text
    mixed = svc.submit("lower-case-usd1", "ord_1001", message="It broke.", currency="uSd")
    assert mixed.status_code == 200, mixed.text
    other = svc.submit("lower-case-gbp1", "ord_1001", message="It broke.", currency="gbp")
    assert other.status_code == 422 and other.json()["detail"] == "currency GBP does not match the order's USD"
