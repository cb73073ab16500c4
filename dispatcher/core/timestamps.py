"""One timestamp format for every reader: ISO 8601 in UTC with ``Z``.

The API's JSON, its CSV export, the CLI and the support page's ``<time>``
elements all write instants with ``iso``, so a value copied from one can be
compared with another as text, whatever the database session's time zone is.
"""

from __future__ import annotations

import datetime as dt


def iso(at: dt.datetime) -> str:
    """``2026-11-23T08:00:00.123456Z`` (no fraction when it is zero, like Pydantic)."""
    if at.tzinfo is None:
        raise ValueError(f"{at!r} names no instant: timestamps here are timezone-aware")
    return at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def utc(field: str, at: dt.datetime) -> dt.datetime:
    """An aware instant someone gave, in UTC: what the database is handed. ISO 8601
    allows offsets up to 23:59 and PostgreSQL only up to 15:59, and an instant in the
    first or last day of year 1 or 9999 can leave Python's range once in UTC: both are
    refused naming the field, not a traceback."""
    from spark_outbox.core.errors import InvalidRequest

    try:
        return at.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidRequest(
            field,
            f"{at.isoformat()} is out of range once in UTC",
            "give an instant between 0001-01-02 and 9999-12-30, e.g. 2026-11-23T08:00:00Z",
        ) from None


def parse(field: str, text: str) -> dt.datetime:
    """An instant a person typed (CLI flags, the support page's forms): ISO 8601 with
    a zone; anything else is refused naming the field and the fix."""
    from spark_outbox.core.errors import InvalidRequest

    try:
        at = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidRequest(
            field,
            f"{text.strip()!r} is not ISO 8601 with a zone",
            "write e.g. 2026-11-23T08:00:00Z",
        )
    return utc(field, at)
