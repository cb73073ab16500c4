"""When to try again: the persistent schedule, jitter, and ``Retry-After``.

The schedule lists the delay before each attempt (Svix-like by default: 0 s,
5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h), so after attempt ``n`` fails the
next waits ``schedule[n]``; past its end the effect is dead. Jitter (±20 %)
spreads a burst of failures so a recovering receiver is not hit all at once.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import random
from collections.abc import Sequence

JITTER = 0.2


def next_delay_s(attempt: int, schedule: Sequence[float]) -> float | None:
    """Delay before the attempt after ``attempt`` (1-based), None when exhausted."""
    if attempt >= len(schedule):
        return None
    base = float(schedule[attempt])
    return base * random.uniform(1 - JITTER, 1 + JITTER)  # noqa: S311 (not crypto)


def parse_retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta-seconds or HTTP date);
    None for anything else (the header is the receiver's data: never trusted to parse)."""
    if not value or len(value) > 100:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    return max(0.0, (when - now).total_seconds())


def delay_with_retry_after(
    attempt: int, schedule: Sequence[float], retry_after_s: float | None, cap_s: float
) -> float | None:
    """The schedule's delay, raised to what the receiver asked for (capped); None: give up."""
    delay = next_delay_s(attempt, schedule)
    if delay is None:
        return None
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, cap_s))
    return delay
