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
