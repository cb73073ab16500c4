"""Lanes: at most ``width`` of a worker's sends at once to each endpoint that cannot
deduplicate, so a crash leaves at most that many of its effects uncertain.

A ``kill -9`` of a dispatcher leaves every send it had started to such an
endpoint 'uncertain', for an operator to decide (docs/dispatcher.md, "Uncertain
sends"); with 128 sends in flight that was once 171 e-mails from one kill. A lane
is taken from a send's start to its end; an effect whose endpoint has every lane
taken waits in that endpoint's line, not in a sender: the sender goes on with the
next claimed effect (another endpoint's sends never wait behind it), and the
sender that ends a send of that endpoint takes the next one from the line,
keeping the lane. Endpoints that deduplicate have no lanes (a resend is harmless
there): they use every sender.
"""

from __future__ import annotations

import collections
from typing import Generic, Protocol, TypeVar


class _Effect(Protocol):
    @property
    def endpoint(self) -> str: ...


E = TypeVar("E", bound=_Effect)


class Lanes(Generic[E]):
    def __init__(self, width: int) -> None:
        self.width = max(1, width)
        self._busy: collections.Counter[str] = collections.Counter()
        self._lines: dict[str, collections.deque[E]] = {}

    def enter(self, effect: E) -> bool:
        """True: a lane of its endpoint is now the caller's, send it; False: it waits in
        its endpoint's line (a ``leave`` of that endpoint hands it out)."""
        name = effect.endpoint
        if self._busy[name] < self.width:
            self._busy[name] += 1
            return True
        self._lines.setdefault(name, collections.deque()).append(effect)
        return False

    def leave(self, endpoint: str) -> E | None:
        """A send to ``endpoint`` ended: the next effect of its line, to send in the
        same lane, or None (the lane is free)."""
        line = self._lines.get(endpoint)
        if line:
            effect = line.popleft()
            if not line:
                del self._lines[endpoint]
            return effect
        self._busy[endpoint] -= 1
        if self._busy[endpoint] <= 0:
            del self._busy[endpoint]
        return None

    def busy(self, endpoint: str) -> int:
        """Lanes of ``endpoint`` taken now."""
        return self._busy[endpoint]

    def waiting(self) -> int:
        """Effects waiting in a line, all endpoints together."""
        return sum(len(line) for line in self._lines.values())
