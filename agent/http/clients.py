"""Who is calling the API: the client whose key is in ``Authorization: Bearer``, and what its scopes allow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials

from agent.http.openapi import bearer
from agent.http.problems import Problem
from agent.identity import Principal
from steps import clients
from steps.records import ApiClient, Scope
from steps.store import app_db


def current_client(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> ApiClient:
    """The live client whose key this is; 401 for no key, an unknown key or a revoked client's key."""
    client = clients.authenticate(app_db().engine, credentials.credentials.strip()) if credentials else None
    if client is None:
        raise Problem(401, "a valid API key is required (Authorization: Bearer <key>)")
    return client


ClientDep = Annotated[ApiClient, Depends(current_client)]


def principal_of(client: ApiClient) -> Principal:
    """The client as a principal, acting for its operator (if it was added for one): that person in every check."""
    return Principal("client", client.name, acts_for=client.operator)


def requiring(*scopes: Scope) -> Callable[[ApiClient], ApiClient]:
    """A dependency that lets through a client holding any of ``scopes`` (``admin`` holds them all); else 403."""

    def check(client: ClientDep) -> ApiClient:
        if not any(client.allows(scope) for scope in scopes):
            raise Problem(403, f"client {client.name} lacks the scope this needs ({' or '.join(scopes)})")
        return client

    return check


def sees_every_refund(client: ApiClient) -> bool:
    """Approvers and admins read every refund; a client with only ``refunds:read`` reads the ones it requested."""
    return client.allows("approvals:decide")
