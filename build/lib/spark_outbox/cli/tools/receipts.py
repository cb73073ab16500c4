"""Receipt bookkeeping shared by the reference webhook receiver and the SMTP catcher.

A receiver that honours idempotency keys must count two things apart: every
delivery that reached it (*raw*) and every distinct key (*unique*). Raw minus
unique is the number of duplicates the at-least-once wire produced; unique is
what the business saw. Both reference receivers keep those counts here, keep
the first receipt of each key, and can append receipts to a JSONL file so a
test or the demo can inspect what arrived.

Failure injection is deterministic: whether the n-th delivery of a key fails
depends only on (seed, key, n), never on arrival order, so a crashed run and a
clean run see the same failures for the same deliveries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any


def fails(seed: int, key: str, nth: int, rate: float) -> bool:
    """True when the ``nth`` (0-based) delivery of ``key`` should be failed on purpose."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    digest = hashlib.sha256(f"{seed}:{key}:{nth}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def check_rate(rate: float) -> float:
    """A failure rate must be a fraction; say how to fix it otherwise."""
    if not 0 <= rate <= 1:
        from spark_outbox.core.errors import ConfigurationError

        raise ConfigurationError(f"fail rate {rate} is not in [0, 1]; give e.g. 0.05 for 5%")
    return rate


@dataclasses.dataclass
class ReceiptLog:
    """Counts and first receipts by key; thread-safe, optionally mirrored to JSONL."""

    seed: int = 0
    fail_rate: float = 0.0
    jsonl_path: Path | None = None
    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    first: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    _seen: Counter[str] = dataclasses.field(default_factory=Counter)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        check_rate(self.fail_rate)
        if self.jsonl_path is not None:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)

    def count(self, name: str) -> None:
        """Count an event that carries no receipt (bad signature, rejection...)."""
        with self._lock:
            self.counts[name] += 1

    def attempt(self, key: str) -> bool:
        """Register one delivery attempt of ``key``; True when it must fail on purpose."""
        with self._lock:
            nth = self._seen[key]
            self._seen[key] += 1
            failed = fails(self.seed, key, nth, self.fail_rate)
            if failed:
                self.counts["failed_on_purpose"] += 1
            return failed

    def accept(self, key: str, receipt: dict[str, Any]) -> bool:
        """Record an accepted delivery; True when ``key`` was new (a unique receipt)."""
        with self._lock:
            self.counts["raw"] += 1
            new = key not in self.first
            if new:
                self.counts["unique"] += 1
                self.first[key] = receipt
            else:
                self.counts["duplicates"] += 1
            if self.jsonl_path is not None:
                line = json.dumps({"key": key, "first": new, **receipt}, default=str)
                with self.jsonl_path.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
            return new

    def stats(self) -> dict[str, int]:
        with self._lock:
            base = dict.fromkeys(
                (
                    "requests",
                    "raw",
                    "unique",
                    "duplicates",
                    "bad_signatures",
                    "failed_on_purpose",
                    "rejected",
                ),
                0,
            )
            return base | dict(self.counts)

    def receipts(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self.first.items())[-limit:] if limit > 0 else []
        return [{"key": k, **v} for k, v in items]
