"""Failed console sign-ins, counted in the application database so that every API process shares them.

Per name: a few failures are free, then each further attempt waits out a delay that doubles with every
failure, up to a cap. An attempt during the delay is refused without its password being checked (and
counts for nothing), so the right password waits too; once the delay has passed it signs in. Per client
address: at most so many failures in a fixed window, whatever names they tried.

An attempt is counted as a failure before its password is checked and forgiven if it succeeds, so a burst
of concurrent guesses cannot all slip in before the first one is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa

from steps.store import console_sign_in_throttle, insert_if_absent, utc

_T = console_sign_in_throttle


@dataclass(frozen=True)
class Backoff:
    free_failures: int
    """Failures for one name before the delays start."""
    first_delay: timedelta
    longest_delay: timedelta
    forget_after: timedelta
    """A name's failures are forgotten once none has been counted for this long."""

    def delay(self, failures: int) -> timedelta:
        """How long the next attempt waits after ``failures`` failures in a row."""
        if failures < self.free_failures:
            return timedelta(0)
        doublings = min(failures - self.free_failures, 32)  # the cap is reached long before; no overflow
        return min(self.first_delay * (1 << doublings), self.longest_delay)


@dataclass(frozen=True)
class AddressLimit:
    failures: int
    window: timedelta


@dataclass(frozen=True)
class Attempt:
    refused_by: Literal["name", "address"] | None
    """None: the attempt may check its password."""
    retry_after: timedelta
    """When refused: how long until an attempt is taken again."""
    name_failures: int
    """The name's failures, this attempt included when it was taken (forgiven if it succeeds)."""
    address_failures: int
    delay: timedelta
    """The delay this attempt starts if it fails."""

    @property
    def allowed(self) -> bool:
        return self.refused_by is None


def name_key(digest: str) -> str:
    return f"name:{digest}"


def address_key(address: str) -> str:
    return f"address:{address}"


def _row(conn: sa.Connection, key: str, now: datetime) -> sa.Row[Any]:
    fresh = {"throttle_key": key, "failures": 0, "window_started_at": now, "retry_at": None, "updated_at": now}
    insert_if_absent(conn, _T, fresh)
    row = conn.execute(sa.select(_T).where(_T.c.throttle_key == key).with_for_update()).first()
    assert row is not None
    return row


def begin_attempt(
    conn: sa.Connection, *, name_digest: str, address: str, now: datetime, backoff: Backoff, limit: AddressLimit
) -> Attempt:
    """Take a sign-in attempt for the name (by its digest) from the address, or refuse it and say why."""
    conn.execute(_T.delete().where(_T.c.updated_at <= now - max(backoff.forget_after, limit.window)))
    name, addr = name_key(name_digest), address_key(address)
    by_name, by_address = _row(conn, name, now), _row(conn, addr, now)  # always in this order: no lock cycle
    name_failures = int(by_name.failures)
    window_start = utc(by_address.window_started_at)
    address_failures = int(by_address.failures)
    if window_start <= now - limit.window:
        window_start, address_failures = now, 0
    retry_at = utc(by_name.retry_at) if by_name.retry_at is not None else None
    if retry_at is not None and retry_at > now:
        return Attempt("name", retry_at - now, name_failures, address_failures, timedelta(0))
    if address_failures >= limit.failures:
        return Attempt("address", window_start + limit.window - now, name_failures, address_failures, timedelta(0))
    name_failures += 1
    delay = backoff.delay(name_failures)
    conn.execute(
        _T.update()
        .where(_T.c.throttle_key == name)
        .values(failures=name_failures, retry_at=now + delay if delay else None, updated_at=now)
    )
    conn.execute(
        _T.update()
        .where(_T.c.throttle_key == addr)
        .values(failures=address_failures + 1, window_started_at=window_start, updated_at=now)
    )
    return Attempt(None, timedelta(0), name_failures, address_failures + 1, delay)


def attempt_succeeded(conn: sa.Connection, *, name_digest: str, address: str) -> None:
    """The password was right: the name starts afresh and the address's count forgives this attempt."""
    conn.execute(_T.delete().where(_T.c.throttle_key == name_key(name_digest)))
    conn.execute(
        _T.update()
        .where(_T.c.throttle_key == address_key(address), _T.c.failures > 0)
        .values(failures=_T.c.failures - 1)
    )
