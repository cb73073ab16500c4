"""Command-line values of the effect filter, checked as the API checks its own."""

from __future__ import annotations

import datetime as dt

from spark_outbox.core.errors import InvalidRequest


def instant(field: str, raw: str | None) -> dt.datetime | None:
    """``--since``/``--until``: ISO 8601 with a zone, or ``InvalidRequest`` naming the fix."""
    if raw is None:
        return None
    try:
        at = dt.datetime.fromisoformat(raw)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidRequest(
            field, f"{raw!r} is not ISO 8601 with a zone", "write e.g. 2026-11-23T08:00:00Z"
        )
    return at
