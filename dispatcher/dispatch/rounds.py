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
    """The lines and their turns. A sender with nothing to take waits on a future of
    its own, woken by the next ``put_nowait``; the effect stays in its line until a
    sender takes it, so a sender cancelled while woken loses nothing (the wake-up goes
    to the next one waiting). Not an ``asyncio.Semaphore``: with 128 senders waiting its
    every acquire scanned the waiters and every wake-up removed one from the middle of a
    deque (asyncio/locks.py in 3.11), ~7 % of a dispatcher's CPU in a profile of a drain
    (bench/RESULTS.md)."""

    def __init__(self) -> None:
        self._lines: dict[str, collections.deque[E]] = {}
        self._turns: collections.deque[str] = collections.deque()  # endpoints with a line
        self._size = 0  # effects waiting, all lines together
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()

    def put_nowait(self, effect: E) -> None:
        line = self._lines.get(effect.endpoint)
        if line is None:
            line = self._lines[effect.endpoint] = collections.deque()
            self._turns.append(effect.endpoint)  # last in the round, as a new arrival
        line.append(effect)
        self._size += 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():  # (a cancelled sender's is done)
                waiter.set_result(None)
                return

    async def get(self) -> E:
        """The next effect of the endpoint whose turn it is; that endpoint's next
        turn comes after every other endpoint waiting has had one."""
        while not self._size:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and self._size:
                    self._wake_one()  # woken, then cancelled: the next one takes it
                raise
        self._size -= 1
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
        return self._size
