"""Rounds: claimed effects wait for a sender in their endpoint's line, and the
senders serve the lines in turn, one effect of each endpoint at a time.

One first-in-first-out queue for all endpoints made a fresh effect of one
endpoint wait behind every effect already claimed for another: under a backlog
that was up to a batch (500) of the backlog's sends, hundreds of milliseconds
(bench/RESULTS.md, issue 31 item 2). In rounds, a fresh effect waits for at most
one send of each other endpoint with effects waiting. Within an endpoint the
order stays the claim's (an ordered endpoint's heads in due order).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, Protocol, TypeVar


class _Effect(Protocol):
    @property
    def endpoint(self) -> str: ...


E = TypeVar("E", bound=_Effect)


class Rounds(Generic[E]):
    def __init__(self) -> None:
        self._lines: dict[str, collections.deque[E]] = {}
        self._turns: collections.deque[str] = collections.deque()  # endpoints with a line
        self._ready = asyncio.Semaphore(0)  # one per effect waiting

    def put_nowait(self, effect: E) -> None:
        line = self._lines.get(effect.endpoint)
        if line is None:
            line = self._lines[effect.endpoint] = collections.deque()
            self._turns.append(effect.endpoint)  # last in the round, as a new arrival
        line.append(effect)
        self._ready.release()

    async def get(self) -> E:
        """The next effect of the endpoint whose turn it is; that endpoint's next
        turn comes after every other endpoint waiting has had one."""
        await self._ready.acquire()
        name = self._turns[0]
        line = self._lines[name]
        effect = line.popleft()
        if line:
            self._turns.rotate(-1)
        else:
            self._turns.popleft()
            del self._lines[name]
        return effect

    def qsize(self) -> int:
        return sum(len(line) for line in self._lines.values())
