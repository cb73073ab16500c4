"""Named phases of a batch write, for logs and for the kill tests.

``reached(name)`` is a no-op in production. Tests use it two ways:
``OUTBOX_SPARK_PHASES=1`` prints ``outbox-phase: <name>`` on stderr (a kill test
waits for a line, sleeps a seeded random delay, then SIGKILLs the driver);
``OUTBOX_SPARK_PAUSE_AT=<name>`` also pauses there so the kill lands exactly at
that phase. In-process tests may register a callback (e.g. one that cuts the
commit connection) with ``on(name, fn)``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

PRINT_ENV = "OUTBOX_SPARK_PHASES"
PAUSE_ENV = "OUTBOX_SPARK_PAUSE_AT"
PAUSE_S_ENV = "OUTBOX_SPARK_PAUSE_S"

_callbacks: dict[str, list[Callable[[], None]]] = {}


def reached(name: str) -> None:
    if os.environ.get(PRINT_ENV) or os.environ.get(PAUSE_ENV):
        print(f"outbox-phase: {name}", file=sys.stderr, flush=True)
    if os.environ.get(PAUSE_ENV) == name:
        time.sleep(float(os.environ.get(PAUSE_S_ENV, "60")))
    for callback in _callbacks.get(name, ()):
        callback()


def on(name: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Register ``callback`` for phase ``name``; returns a function that removes it."""
    _callbacks.setdefault(name, []).append(callback)
    return lambda: _callbacks[name].remove(callback)
