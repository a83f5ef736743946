"""A refund waiting for a person gives its worker's queue slot back while it waits.

DBOS counts a queued workflow against its queue's ``worker_concurrency`` for as long as the workflow
runs, and a workflow parked on ``DBOS.recv`` is running. Refunds wait for approvers for up to days,
so with a concurrency of 4 four unanswered approvals would stop a worker from starting any other
refund. DBOS 3.4 has no public call for this, so the wait is bracketed here, in one place: the
workflow's entry in this process's registry of active workflows stops naming the queue while it
waits and names it again before the workflow body goes on. Only the in-memory count that the
queue's dequeue loop reads changes; nothing in the database does, and recovery still re-runs the
workflow from its checkpoints. DBOS releases the entry only after the workflow body returns, by
which time the queue is named again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dbos import DBOS

log = logging.getLogger(__name__)


def _registry() -> Any | None:
    try:
        from dbos._dbos import _get_dbos_instance

        active = _get_dbos_instance()._active_workflows_set
        active._lock, active._m  # noqa: B018 - the two attributes this module relies on
        return active
    except (ImportError, AttributeError) as error:  # a DBOS release that keeps its registry elsewhere
        log.warning("cannot release the queue slot of a waiting refund (%s); it keeps its slot", error)
        return None


@contextmanager
def queue_slot_released() -> Iterator[None]:
    """While the body runs, this workflow does not count against its queue's per-worker concurrency."""
    workflow_id = DBOS.workflow_id
    active = _registry() if workflow_id else None
    held: tuple[str, str | None] | None = None
    if active is not None:
        with active._lock:
            buckets: list[Any] = active._m.get(workflow_id, [])
            held = next((bucket for bucket in buckets if bucket is not None), None)
            if held is not None:
                buckets[buckets.index(held)] = None
    try:
        yield
    finally:
        if active is not None and held is not None:
            with active._lock:
                buckets = active._m.get(workflow_id, [])
                if None in buckets:
                    buckets[buckets.index(None)] = held
