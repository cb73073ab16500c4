"""The queue's two figures: effects due now, and how long the oldest has been due.

Read by the worker for its metrics and by the console for ``/v1/status``: one
statement, on the ground floor, so neither has to import the other.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "queue.sql")

# The two figures' descriptions, the same in the worker's and the API's metrics.
QUEUE_DEPTH_HELP = "Effects due now (claimable, next attempt not in the future)"
OLDEST_DUE_AGE_HELP = "How long the oldest due effect has waited (0 when none is due)"


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Effects due now, and how long the oldest of them has been due (0 when none)."""

    depth: int
    oldest_due_age_s: float


def queue_stats(conn: Connection) -> QueueStats:
    """The two figures; JIT stays off for the rest of ``conn``'s transaction
    (queue.sql, without_jit: it doubled the count's time beside a backlog)."""
    conn.execute(_Q["without_jit"])
    row = conn.execute(_Q["queue_stats"]).one()
    return QueueStats(depth=int(row[0]), oldest_due_age_s=max(0.0, float(row[1])))
