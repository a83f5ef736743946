"""Synchronous steps awaited from async workflow code run on a worker thread, not on the event loop.

A DBOS step or datasource transaction written as a plain function does its checkpoint reads and
writes and its own SQL with blocking drivers. Called directly from an ``async`` workflow it would
hold the event loop for all of that, so one process would run one step at a time however many
refunds it has in flight. ``call`` hands it to the event loop's default executor (DBOS installs its
own thread pool there) and awaits it, as DBOS does for sync steps passed to ``DBOS.run_step_async``.
The thread sees the workflow's DBOS context (``asyncio.to_thread`` copies context variables), and
the workflow awaits each step before the next, so step ids are assigned in the same order on every
replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


async def call(step: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``step(*args, **kwargs)`` on a worker thread and await its result."""
    return await asyncio.to_thread(step, *args, **kwargs)
