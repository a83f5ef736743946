"""The operator console links each of a refund's workflows to a DBOS console's view of it, when one is configured."""

from __future__ import annotations

import re
from decimal import Decimal
from urllib.parse import quote

import pytest
from pydantic import ValidationError

from agent.settings import Settings
from tests.conftest import Env
from tests.console_server import console_server
from tests.test_workflow import parked, submit

ARGUS = "http://127.0.0.1:8090/#/workflows/{workflow_id}"
HOSTED = "https://console.example.com/apps/refunds/workflows/{workflow_id}"


def links(html: str) -> list[str]:
    return re.findall(r'<a class="dbos-link" href="([^"]+)"', html)


def test_each_workflow_of_a_refund_links_to_its_dbos_console_view_when_configured(env: Env) -> None:
    with console_server(env, refund_agent_dbos_console_url=ARGUS) as (server, client):
        refund_id = submit(client, "dbos:link.1", "ord_1002", "Please refund 150.00", amount=Decimal("150.00"))
        parked(client, refund_id)
        with server.signed_in("ada") as http:
            html = http.get(f"/console/refunds/{refund_id}").text
    workflows = re.findall(r'data-workflow="([^"]+)"', html)
    assert refund_id in workflows and len(workflows) >= 2  # the deciding workflow and its timers
    # argus reads the id from the page's fragment, which it decodes once first: escaped twice there.
    assert links(html) == [ARGUS.replace("{workflow_id}", quote(quote(w, safe=""), safe="")) for w in workflows]
    assert f"{ARGUS[:-13]}dbos%253Alink.1%252Fdeadline" in links(html)  # opens the timer (tests/test_dbos_argus.py)


@pytest.mark.parametrize(
    ("url", "link"),
    [
        (HOSTED, "https://console.example.com/apps/refunds/workflows/r%3A1%2Fsettle"),  # one path segment
        (ARGUS, "http://127.0.0.1:8090/#/workflows/r%253A1%252Fsettle"),
        ("https://viewer.example.com/w/{workflow_id}#steps", "https://viewer.example.com/w/r%3A1%2Fsettle#steps"),
    ],
)
def test_a_workflow_id_is_escaped_as_one_segment_and_once_more_inside_a_fragment(url: str, link: str) -> None:
    assert Settings(refund_agent_dbos_console_url=url).console.dbos_console_link("r:1/settle") == link


def test_no_dbos_console_link_is_shown_when_none_is_configured(env: Env) -> None:
    with console_server(env) as (server, client):
        refund_id = submit(client, "dbos-link-2", "ord_1002", "Please refund 150.00", amount=Decimal("150.00"))
        parked(client, refund_id)
        with server.signed_in("ada") as http:
            html = http.get(f"/console/refunds/{refund_id}").text
    assert refund_id in html and links(html) == [] and "DBOS console" not in html


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8090/workflows/", "javascript:alert(1)//{workflow_id}", "127.0.0.1:8090/{workflow_id}"]
)
def test_a_dbos_console_url_without_a_workflow_place_or_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match=r"\{workflow_id\}"):
        Settings(refund_agent_dbos_console_url=url)
