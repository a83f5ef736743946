"""The handles a caller of the running product gets: the HTTP API, the Slack and link approvals, the console.

Built once per process by ``agent.http.server.create_app`` and kept on the app; handlers receive it through
``ServicesDep``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from dbos import DBOSClient
from fastapi import Depends, Request

from agent import approvals, policy
from agent.settings import Settings


@dataclass
class Services:
    settings: Settings
    client: DBOSClient
    limits: policy.Limits
    signing_secret: bytes
    decider: approvals.Decider
    """Runs a refund's decision workflow: in this process, where DBOS is launched."""


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]
