"""Durations as operators type them: ``90s``, ``15m``, ``24h``, ``30d`` (or plain seconds).

One parser for the CLI (``--overlap``, ``--older-than``, ``--since 3d``) and the
settings (``OUTBOX_RETENTION_OLDER_THAN``), so every place reads them alike.
"""

from __future__ import annotations

import re

from spark_outbox.core.errors import InvalidRequest

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION_S = 36_500 * 86_400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration_s(field: str, text: str) -> float:
    """Seconds in ``text``; ``InvalidRequest`` naming ``field`` and the accepted forms."""
    match = _DURATION.match(text or "")
    if match is None:
        raise InvalidRequest(
            field,
            f"{text!r} is not a duration",
            "write a number with a unit: 90s, 15m, 24h, 30d or 2w (plain numbers are seconds)",
        )
    seconds = float(match.group(1)) * _UNITS_S[match.group(2) or "s"]
    if seconds > MAX_DURATION_S:  # a timedelta or a timestamp of it would overflow
        raise InvalidRequest(
            field,
            f"{text.strip()!r} is longer than 100 years",
            "write a duration of at most 36500d",
        )
    return seconds


def describe_s(seconds: float) -> str:
    """The largest whole unit that fits, for messages: 86400 -> '1d', 5400 -> '90m'."""
    for unit, size in sorted(_UNITS_S.items(), key=lambda u: -u[1]):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
