"""The audit log across refunds: filtered by refund, actor, event and date, newest first, a page at a time."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from agent.console import pages
from agent.console.pages import SessionDep, StateDep
from steps import audit
from steps.records import AuditEntry
from steps.store import app_db

router = APIRouter(prefix="/console", include_in_schema=False)
PAGE_SIZE = 50
Text = Annotated[str | None, Query(max_length=200)]


def _day(value: str | None) -> date | None:
    try:
        return date.fromisoformat(value) if value else None
    except ValueError:
        return None


def _midnight(day: date) -> datetime:
    return datetime.combine(day, datetime.min.time(), UTC)


def actor_of(entry: AuditEntry) -> str:
    """Who the entry names as acting (the first actor field it has); empty for the service itself."""
    for name in audit.ACTOR_FIELDS:
        value = entry.payload.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


@router.get("/audit")
def audit_page(
    request: Request,
    state: StateDep,
    session: SessionDep,
    refund: Text = None,
    actor: Text = None,
    event: Text = None,
    since: Text = None,
    until: Text = None,
    page: Annotated[int, Query(ge=1, le=10_000)] = 1,
) -> Response:
    if session is None or session.operator is None:  # every role reads the log, a viewer too
        return pages.to_login(request, state)
    first, last = _day(since), _day(until)
    flt = audit.AuditFilter(
        refund_id=(refund or "").strip() or None,
        actor=(actor or "").strip() or None,
        event=(event or "").strip() or None,
        since=_midnight(first) if first else None,
        until=_midnight(last) + timedelta(days=1) if last else None,
    )
    with app_db().engine.connect() as conn:
        found = audit.search(conn, flt, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE + 1)
        events = audit.event_names(conn)
        chain = audit.verify(conn)
    shown = {"refund": flt.refund_id, "actor": flt.actor, "event": flt.event, "since": first, "until": last}
    query = {k: str(v) for k, v in shown.items() if v}
    rows = [{"entry": e, "actor": actor_of(e)} for e in found[:PAGE_SIZE]]
    return pages.render(
        request,
        state,
        session,
        "audit.html",
        rows=rows,
        more=len(found) > PAGE_SIZE,
        page=page,
        flt=shown,
        query=query,
        events=events,
        chain=chain,
    )
