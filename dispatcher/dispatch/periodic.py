"""The one loop behind the worker's periodic side tasks (heartbeat, settle_uncertain,
park, expire, fold_counts, auto_disable, progress, retention).

``every`` runs a step, then waits for the interval or the worker's stop, whichever
comes first, and returns once stopping. It catches nothing, on purpose: a step
that raises ends the side task, and the worker stops with a non-zero exit (its
``_side_task_done``) so a supervisor restarts it; a database that is away is
not an error here, since every store call retries it (``DbCalls``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


async def every(
    interval_s: float,
    step: Callable[[], Awaitable[object]],
    *,
    stop: asyncio.Event,
    wait_first: bool = False,
) -> None:
    """``step()`` every ``interval_s`` (after it ends) until ``stop`` is set; with
    ``wait_first``, the first one an interval after the start."""
    if wait_first and await _stopped_within(stop, interval_s):
        return
    while not stop.is_set():
        await step()
        if await _stopped_within(stop, interval_s):
            return


async def _stopped_within(stop: asyncio.Event, interval_s: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), interval_s)
    return stop.is_set()
