"""The queue's two figures: effects due now, and how long the oldest has been due.

Read by the worker for its metrics and progress line and by the console for
``/v1/status`` and the API's metrics, in all and per endpoint: on the ground floor,
so neither has to import the other.

A count reads every due effect: beside a due backlog of 1,000,000 it took
185-238 ms of PostgreSQL (bench/RESULTS.md), on every status page (twice: in all
and per endpoint), scrape, heartbeat and progress line, exactly while the drain
needs the cores. So a reader counts at most ``EXACT_UP_TO`` due effects: fewer,
and that count is the answer, exact and live (``as_of`` None), as it always was.
Beyond, the figures are those of the last full count, the queue's snapshot
(migration 2813), with the time it was taken (``as_of``): a reader takes one when
the snapshot is older than its ``refresh_after_s`` (a dispatcher: its heartbeat
interval, so with dispatchers running the snapshot is a few seconds old), one at
a time (an advisory lock taken with try: a reader never waits for another's
count), and none is used older than ``SNAPSHOT_MAX_AGE_S`` (then the reader
counts, as before). A backlog that large moves by thousands a second: its depth
to the effect was never a fact any reader could act on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "queue.sql")

# The two figures' descriptions, the same in the worker's and the API's metrics.
QUEUE_DEPTH_HELP = "Effects due now (claimable, next attempt not in the future)"
OLDEST_DUE_AGE_HELP = "How long the oldest due effect has waited (0 when none is due)"

# Due effects a reader counts itself, at most: below it the figures are exact and
# live (~2 ms of reading at the cap, against ~200 ms a count at 1,000,000).
EXACT_UP_TO = 10_000
# A snapshot older than this is never used: the reader counts, and writes it.
SNAPSHOT_MAX_AGE_S = 15.0
# The advisory lock whose holder takes the snapshot (an arbitrary constant: "outbox q").
_SNAPSHOT_LOCK = 0x6F7574626F7871


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Effects due now, and how long the oldest of them has been due (0 when none);
    ``as_of``: when they were counted, if not by this read (the snapshot)."""

    depth: int
    oldest_due_age_s: float
    as_of: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class Queue:
    """The figures in all and per endpoint (endpoints with nothing due are absent)."""

    total: QueueStats
    endpoints: Mapping[str, QueueStats]


def queue_stats(conn: Connection, *, refresh_after_s: float = SNAPSHOT_MAX_AGE_S) -> QueueStats:
    """The two figures for the whole queue (``queue``)."""
    return queue(conn, refresh_after_s=refresh_after_s).total


def queue(
    conn: Connection, *, refresh_after_s: float = SNAPSHOT_MAX_AGE_S, cap: int = EXACT_UP_TO
) -> Queue:
    """The figures: counted when fewer than ``cap`` effects are due, else the
    snapshot (taken by this read when older than ``refresh_after_s``). JIT stays off
    for the rest of ``conn``'s transaction (queue.sql, without_jit: it doubled a
    full count's time beside a backlog). Commit ``conn`` for the snapshot to stay."""
    conn.execute(_Q["without_jit"])
    rows = conn.execute(_Q["queue_stats"], {"cap": cap}).all()
    if sum(int(r[1]) for r in rows) < cap:
        return _queue({r[0]: (r[1], r[2]) for r in rows}, None)
    found = None
    if not conn.execute(_Q["read_only"]).scalar_one():
        fresh = {"refresh_after_s": refresh_after_s, "lock_key": _SNAPSHOT_LOCK}
        found = conn.execute(_Q["refresh_snapshot"], fresh).first()
    if found is None:  # not this reader's turn: the snapshot there, if young enough
        found = conn.execute(_Q["snapshot"], {"max_age_s": SNAPSHOT_MAX_AGE_S}).first()
    if found is not None:
        try:
            return _queue(found[0], found[1])
        except (TypeError, ValueError, AttributeError):  # a row edited by hand: not ours
            pass
    # None young enough (another reader counting), or unreadable: count, as before.
    return _queue({r[0]: (r[1], r[2]) for r in conn.execute(_Q["count_all"])}, None)


def _queue(figures: Mapping[str, Any], as_of: dt.datetime | None) -> Queue:
    endpoints = {
        name: QueueStats(int(depth), max(0.0, float(age)), as_of)
        for name, (depth, age) in figures.items()
    }
    total = QueueStats(
        depth=sum(s.depth for s in endpoints.values()),
        oldest_due_age_s=max((s.oldest_due_age_s for s in endpoints.values()), default=0.0),
        as_of=as_of,
    )
    return Queue(total, endpoints)
