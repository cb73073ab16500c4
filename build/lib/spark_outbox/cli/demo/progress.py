"""Progress lines for long steps and a stopwatch for the report's time per stage.

Plain text lines (no terminal control codes), so they read the same in a
terminal, a CI log or a pipe.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from spark_outbox.cli.demo.procs import Child


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def bar(done: int, total: int, width: int = 30) -> str:
    frac = 0.0 if total <= 0 else min(1.0, done / total)
    filled = int(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} ({frac:.0%})"


class Stopwatch:
    """Collects ``{"name", "seconds"}`` per stage, in order."""

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        say(f"==> {name}")
        start = time.monotonic()
        try:
            yield
        finally:
            seconds = round(time.monotonic() - start, 2)
            self.stages.append({"name": name, "seconds": seconds})
            say(f"    ({seconds:.1f} s)")


def watch(child: Child, describe: Callable[[], str], interval_s: float = 5.0) -> None:
    """Print ``describe()`` every ``interval_s`` while ``child`` runs."""
    start = time.monotonic()
    last = start
    while child.running():
        time.sleep(0.2)
        if time.monotonic() - last >= interval_s:
            last = time.monotonic()
            with contextlib.suppress(Exception):  # progress is best effort, never fatal
                say(f"    {time.monotonic() - start:5.0f} s  {describe()}")
