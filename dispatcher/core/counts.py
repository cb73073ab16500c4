"""How many visible effects each endpoint has in each state, and how many attempts a
minute ended how, without counting them.

``effect_counts`` is written by triggers on ``effects`` (``objects/counts.sql``):
every statement that enqueues, claims, records, cancels, purges or deletes adds
its changes as rows there. ``by_endpoint_and_state`` sums them: the cost of a read
is the number of rows since the last ``fold``, not the size of the history
(/v1/status read every effect before: 4.2 s at 10M). ``attempt_counts`` is kept
the same way from the attempt log, by minute and outcome: the status page's
throughput and chart (``spark_outbox.console.health``). The dispatchers fold both
every heartbeat; on the ground floor because the console reads and the hot path
folds.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "counts.sql")


def by_endpoint_and_state(conn: Connection) -> dict[tuple[str, str], int]:
    """{(endpoint, state): visible effects}; absent pairs hold none."""
    rows = conn.execute(_Q["by_endpoint_and_state"])
    return {(endpoint, state): int(n) for endpoint, state, n in rows}


def by_state(conn: Connection) -> dict[str, int]:
    """{state: visible effects} over all endpoints."""
    totals: dict[str, int] = {}
    for (_, state), n in by_endpoint_and_state(conn).items():
        totals[state] = totals.get(state, 0) + n
    return totals


# Attempts per minute are kept this long: the status chart's longest range and one.
KEEP_ATTEMPT_HOURS = 25


def fold(conn: Connection) -> int:
    """Fold the rows written since the last fold (effect and attempt counts); how
    many were folded."""
    effects = int(conn.execute(_Q["fold"]).scalar_one())
    attempts = conn.execute(_Q["fold_attempts"], {"keep_hours": KEEP_ATTEMPT_HOURS})
    return effects + int(attempts.scalar_one())
