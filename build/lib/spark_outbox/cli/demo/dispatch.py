"""The dispatchers of the demo: two replicas, as in production, draining one outbox.

They start before Spark and deliver while batches commit (woken by NOTIFY);
``drain`` then waits until nothing is pending or leased, showing progress,
and ``stop`` sends SIGTERM (a clean shutdown). Each replica is its own
process, so ``--crash`` can kill one with SIGKILL mid-drain.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import tally
from spark_outbox.cli.demo.procs import Child, DemoFailed, tail
from spark_outbox.cli.demo.progress import bar, say


class Dispatchers:
    def __init__(self, env: Mapping[str, str], log_dir: Path, replicas: int = 2) -> None:
        self.env = env
        self.log_dir = log_dir
        self.children: list[Child] = []
        self._started = 0
        for _ in range(replicas):
            self.start_one()

    def start_one(self) -> Child:
        self._started += 1
        worker_id = f"demo-dispatcher-{self._started}"
        child = Child(
            worker_id,
            ["dispatcher", "run", "--concurrency", "32"],
            {**self.env, "OUTBOX_WORKER_ID": worker_id},
            self.log_dir,
        )
        self.children.append(child)
        return child

    def alive(self) -> list[Child]:
        return [c for c in self.children if c.running()]

    def stop(self) -> list[int]:
        """SIGTERM every live replica; their exit codes (0 is a clean shutdown)."""
        return [c.stop() for c in self.alive()]


def drain(engine: Engine, dispatchers: Dispatchers, timeout_s: float) -> None:
    """Wait until every effect is delivered, dead or cancelled; print a progress bar."""
    deadline = time.monotonic() + timeout_s
    last_print = 0.0
    while True:
        with engine.connect() as conn:
            unfinished = tally.unfinished_count(conn)
            total = sum(sum(s.values()) for s in tally.effects_by_endpoint(conn).values())
        if time.monotonic() - last_print >= 2 or unfinished == 0:
            last_print = time.monotonic()
            say(f"    delivering {bar(total - unfinished, total)}")
        if unfinished == 0:
            return
        if not dispatchers.alive():
            last = dispatchers.children[-1]
            raise DemoFailed(f"every dispatcher exited; last log:\n{tail(last.log_path)}")
        if time.monotonic() > deadline:
            raise DemoFailed(f"{unfinished:,} effects still unfinished after {timeout_s:.0f} s")
        time.sleep(0.5)
