"""Principals the suite acts as: the help desk's API client submits, the operator dana decides.

Live services in the suite are configured alike: the service's API token is the help desk's key (the
``default`` client: refunds:create, refunds:read); ``approvals-desk`` is a second client that may decide;
dana is a console operator with the approver role, reachable from Slack as ``T0001/U0001``.
"""

from __future__ import annotations

import json
import re
from functools import cache

import sqlalchemy as sa

from agent.identity import Principal
from steps import clients
from steps.refunds import Requester
from steps.store import outbox

#: The requester of the suite's refunds (as if submitted over the API by the help desk's client).
HELPDESK = Requester(principal="client:helpdesk")
#: A console operator with the approver role: decides refunds the help desk requested.
DANA = Principal("operator", "dana")
DANA_PASSWORD = "dana-approver-passphrase"
SLACK_DANA = "T0001/U0001"
APPROVER_CLIENT = "approvals-desk"
_LINK = re.compile(r"/approve/([A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+)")


@cache
def operators_json() -> str:
    """``REFUND_AGENT_OPERATORS`` with dana as an approver (hashed once per process)."""
    from tests.console_server import quick_hash

    return json.dumps({"dana": f"approver:{quick_hash(DANA_PASSWORD)}"})


def approver_env() -> dict[str, str]:
    """Environment for a live service: dana as the one approver, and her Slack id on the allow-list."""
    return {"REFUND_AGENT_OPERATORS": operators_json(), "SLACK_APPROVERS": json.dumps({SLACK_DANA: "dana"})}


def add_approver_client(engine: sa.Engine, key: str) -> None:
    """The API client that decides refunds in the suite (scope approvals:decide), with a known key."""
    clients.add_client(engine, name=APPROVER_CLIENT, scopes=["approvals:decide"], key=key)


def link_token(engine: sa.Engine, refund_id: str, operator: str = "dana", kind: str = "request") -> str | None:
    """The approval link's token in the message sent to ``operator`` (the outbox), if one was sent."""
    with engine.connect() as conn:
        body = conn.execute(
            sa.select(outbox.c.body).where(outbox.c.message_key == f"{refund_id}:approvers:{kind}:{operator}")
        ).scalar()
    found = _LINK.search(body or "")
    return found.group(1) if found else None
