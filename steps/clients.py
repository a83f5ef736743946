"""API clients: who calls the HTTP API, with which scopes. A key is shown once and kept only as its SHA-256.

Keys are 32 random bytes (or, for the default client, the configured or generated API token, which the
settings refuse below 32 bytes), so a plain SHA-256 is enough to keep a stolen table from being used: there
is nothing to guess. The key's hash is the lookup, so checking a key is one indexed read.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from steps import audit
from steps.records import NAME_PATTERN, SCOPES, ApiClient, Scope
from steps.store import api_clients, utc

KEY_PREFIX = "ra_"
DEFAULT_CLIENT = "default"
#: What the embedded default's generated token may do: submit refunds and read its own. Deciding is for people.
DEFAULT_SCOPES: tuple[Scope, ...] = ("refunds:create", "refunds:read")
#: ``last_used_at`` is written at most this often per client, so reads stay reads.
LAST_USED_RESOLUTION = timedelta(minutes=1)
_NAME = re.compile(NAME_PATTERN)


class ClientError(ValueError):
    """A client that cannot be made or changed as asked."""


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_scopes(text: str | Iterable[str]) -> tuple[Scope, ...]:
    items = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    unknown = [s for s in items if s not in SCOPES]
    if unknown or not items:
        raise ClientError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(items) or 'none'}")
    return tuple(s for s in SCOPES if s in items)


def _record(row: Any) -> ApiClient:
    return ApiClient(
        client_id=row.client_id,
        name=row.name,
        scopes=parse_scopes(row.scopes),
        operator=row.operator,
        created_at=utc(row.created_at),
        last_used_at=utc(row.last_used_at) if row.last_used_at else None,
        revoked_at=utc(row.revoked_at) if row.revoked_at else None,
    )


def add_client(
    engine: sa.Engine,
    *,
    name: str,
    scopes: Iterable[str],
    operator: str | None = None,
    key: str | None = None,
    actor: str = "",
) -> tuple[ApiClient, str]:
    """Make a client; returns it and its key (the only time the key exists outside its holder)."""
    if not _NAME.match(name):
        raise ClientError(f"client name {name!r}: 1-100 letters, digits or ._@- (no ':' or spaces)")
    if operator is not None and not _NAME.match(operator):
        raise ClientError(f"operator name {operator!r}: 1-100 letters, digits or ._@-")
    granted = parse_scopes(scopes if isinstance(scopes, str) else list(scopes))
    if key is not None and len(key.encode()) < 32:
        raise ClientError("a client key must be at least 32 bytes")
    key = key or KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        with engine.begin() as conn:
            _insert(conn, client_id="cl_" + secrets.token_hex(8), name=name, digest=key_hash(key), scopes=granted,
                    operator=operator, actor=actor)  # fmt: skip
    except sa.exc.IntegrityError as error:
        raise ClientError(f"a client named {name!r} exists already (revoked clients keep their name)") from error
    with engine.connect() as conn:
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == name)).one()
    return _record(row), key


def _insert(
    conn: sa.Connection,
    *,
    client_id: str,
    name: str,
    digest: str,
    scopes: tuple[Scope, ...],
    operator: str | None,
    actor: str,
) -> None:
    """The client's row and its ``client_added`` audit entry, in the caller's transaction."""
    now = datetime.now(UTC)
    values = {"client_id": client_id, "name": name, "key_hash": digest, "scopes": " ".join(scopes)}
    conn.execute(api_clients.insert().values(**values, operator=operator, created_at=now))
    payload = {"client": name, "scopes": list(scopes), "operator": operator, "by": actor}
    audit.append(conn, refund_id="", event="client_added", payload=payload, now=now)


def list_clients(engine: sa.Engine) -> list[ApiClient]:
    with engine.connect() as conn:
        return [_record(r) for r in conn.execute(sa.select(api_clients).order_by(api_clients.c.created_at))]


def get_client(engine: sa.Engine, name: str) -> ApiClient | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == name)).first()
    return _record(row) if row is not None else None


def revoke_client(engine: sa.Engine, name: str, *, actor: str = "") -> ApiClient:
    """Revoke a client at once: its key is refused from the next request on."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == name)).first()
        if row is None:
            raise ClientError(f"no client named {name!r}")
        if row.revoked_at is None:
            conn.execute(api_clients.update().where(api_clients.c.name == name).values(revoked_at=now))
            audit.append(conn, refund_id="", event="client_revoked", payload={"client": name, "by": actor}, now=now)
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == name)).one()
    return _record(row)


def authenticate(engine: sa.Engine, key: str) -> ApiClient | None:
    """The live client whose key this is, or None (unknown or revoked). Notes when it was last used."""
    if not key:
        return None
    digest = key_hash(key)
    with engine.connect() as conn:
        row = conn.execute(sa.select(api_clients).where(api_clients.c.key_hash == digest)).first()
    if row is None or row.revoked_at is not None:
        return None
    now = datetime.now(UTC)
    if row.last_used_at is None or now - utc(row.last_used_at) >= LAST_USED_RESOLUTION:
        with engine.begin() as conn:
            conn.execute(api_clients.update().where(api_clients.c.client_id == row.client_id).values(last_used_at=now))
    return _record(row)


def ensure_default_client(engine: sa.Engine, key: str) -> ApiClient | None:
    """The service's own token is the client ``default`` (refunds:create, refunds:read): made on first start,
    its key updated when the configured token changes. A revoked default client stays revoked (None)."""
    digest = key_hash(key)
    with engine.begin() as conn:
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == DEFAULT_CLIENT)).first()
        if row is not None and row.revoked_at is not None:
            return None
        if row is not None and row.key_hash == digest:
            return _record(row)
        owner = conn.execute(sa.select(api_clients.c.name).where(api_clients.c.key_hash == digest)).scalar()
        if owner is not None:  # the token is already another client's key: it stays that client's
            return None
        if row is not None:
            conn.execute(api_clients.update().where(api_clients.c.name == DEFAULT_CLIENT).values(key_hash=digest))
            payload = {"client": DEFAULT_CLIENT}
            audit.append(conn, refund_id="", event="client_key_replaced", payload=payload, now=datetime.now(UTC))
        else:
            _insert(conn, client_id="cl_default", name=DEFAULT_CLIENT, digest=digest, scopes=DEFAULT_SCOPES,
                    operator=None, actor="service")  # fmt: skip
        row = conn.execute(sa.select(api_clients).where(api_clients.c.name == DEFAULT_CLIENT)).one()
    return _record(row)
