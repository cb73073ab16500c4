"""Command-line values of the effect filter, checked as the API checks its own."""

from __future__ import annotations

import argparse
import datetime as dt

from spark_outbox.core.errors import InvalidRequest


def port(raw: str) -> int:
    """A TCP port flag (argparse ``type``): 0 to 65535, else argparse's one-line error
    (a port of 70000 once ended in a traceback from bind())."""
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 65_535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port: use 0 to 65535 (0: a free one)")
    return value


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
