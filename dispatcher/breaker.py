"""An in-process circuit breaker per endpoint: a failing receiver is rested, not hammered.

After ``threshold`` consecutive transient failures (5xx, 408/429, timeouts,
connection errors) the endpoint's claimed effects are handed back unsent for a
cool-down that doubles on each further failure (capped); one success closes it.
A 410 opens it for good in this process (the endpoint is also paused in the
database, so no worker claims its effects until an operator resumes it).
"""

from __future__ import annotations

import time

THRESHOLD = 5
FIRST_COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 60.0


class Breakers:
    def __init__(self) -> None:
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}

    def rest_s(self, endpoint: str) -> float | None:
        """Seconds the endpoint should rest (None: send now)."""
        until = self._open_until.get(endpoint)
        if until is None:
            return None
        left = until - time.monotonic()
        return left if left > 0 else None

    def outcome(self, endpoint: str, outcome: str) -> None:
        if outcome == "delivered":
            self._failures.pop(endpoint, None)
            self._open_until.pop(endpoint, None)
        elif outcome == "gone":
            self._open_until[endpoint] = float("inf")
        elif outcome == "retry":
            count = self._failures.get(endpoint, 0) + 1
            self._failures[endpoint] = count
            if count >= THRESHOLD:
                cooldown = min(MAX_COOLDOWN_S, FIRST_COOLDOWN_S * 2 ** (count - THRESHOLD))
                self._open_until[endpoint] = time.monotonic() + cooldown

    def forget(self, endpoint: str) -> None:
        """The endpoint was resumed (or changed): start afresh."""
        self._failures.pop(endpoint, None)
        self._open_until.pop(endpoint, None)
