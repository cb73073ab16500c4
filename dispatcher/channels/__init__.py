"""Channels send one claimed effect to one endpoint and say what happened.

A channel never touches the database: it returns a ``Sent`` and the worker
records it. Channels classify the answer (delivered / retry / dead / gone); the
retry policy decides when.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dispatcher.endpoints import Endpoint
    from dispatcher.store import Claimed

# Response excerpts kept in the attempt log are at most this many bytes.
EXCERPT_BYTES = 2048


@dataclasses.dataclass(frozen=True)
class Sent:
    """What one attempt produced: ``outcome`` is delivered, retry, dead or gone."""

    outcome: str
    status_code: int | None = None
    error_class: str | None = None
    error: str | None = None
    response_excerpt: str | None = None
    retry_after_s: float | None = None


def clip(text: str, limit: int = EXCERPT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (never mid-character)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


class Channel(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, endpoint: Endpoint, effect: Claimed, timeout_s: float) -> Sent: ...
