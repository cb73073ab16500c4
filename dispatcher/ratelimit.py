"""Per-endpoint rate limits: a token bucket per endpoint, in this process.

With several workers each enforces the limit on its own sends, so the total
rate an endpoint sees is at most (workers x limit): documented, not hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class TokenBucket:
    def __init__(self, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s
        self._capacity = max(1.0, rate_per_s)
        self._tokens = self._capacity
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now

    async def take(self, hold: asyncio.Event) -> bool:
        """Wait until one send is allowed (True) or ``hold`` is set (False)."""
        while not hold.is_set():
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hold.wait(), (1 - self._tokens) / self.rate_per_s)
        return False


class RateLimits:
    """One bucket per endpoint name, rebuilt when its configured rate changes."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    async def take(self, endpoint: str, rate_per_s: float | None, hold: asyncio.Event) -> bool:
        """True when the send may start now; False when held back by a shutdown."""
        if hold.is_set():
            return False
        if not rate_per_s or rate_per_s <= 0:
            return True
        bucket = self._buckets.get(endpoint)
        if bucket is None or bucket.rate_per_s != rate_per_s:
            bucket = self._buckets[endpoint] = TokenBucket(rate_per_s)
        return await bucket.take(hold)
