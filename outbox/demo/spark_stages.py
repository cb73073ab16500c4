"""The Spark side of the demo: generate usage data, the billing job in batch, then streaming.

Each run is ``outbox spark ...`` as its own process (driver + local JVM), so
``--crash`` can SIGKILL a driver mid-commit and run it again.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection, Engine

from dispatcher import tally
from outbox.demo import crash
from outbox.demo.procs import Child, DemoFailed, run_step, tail, wait_until
from outbox.demo.progress import Stopwatch, say, watch

JOB = "billing"
STREAM_WAVES = 2


def uncommitted_attempt(conn: Connection, job: str) -> str | None:
    """Describe a batch caught between staging and its commit marker, or None."""
    seen = tally.uncommitted_attempt(conn, job)
    if seen is None:
        return None
    phase = "during the one-transaction merge" if seen.merging else "while staging"
    return (
        f"{phase} of batch {seen.batch_id} (attempt {seen.attempt_id[:8]}, "
        f"{seen.staged_results:,} result and {seen.staged_effects:,} effect rows staged, "
        "no commit marker yet)"
    )


class SparkStages:
    def __init__(
        self,
        args: argparse.Namespace,
        env: Mapping[str, str],
        run_dir: Path,
        logs: Path,
        engine: Engine,
    ) -> None:
        self.args = args
        self.env = dict(env)
        self.logs = logs
        self.engine = engine
        data = run_dir / "data"
        self.batch_in = data / "usage-batch"
        self.arriving = data / "usage-arriving"
        self.stream_in = data / "usage-stream"
        self.checkpoint = data / "checkpoint"

    # -- the stages ----------------------------------------------------------

    def run_all(self, sw: Stopwatch, crash_events: list[str] | None) -> None:
        with sw.stage("generate usage data"):
            self.generate()
        with sw.stage("spark: billing job, batch mode"):
            self.batch(crash_events)
        with sw.stage("spark: billing job, streaming over arriving files"):
            self.stream()

    def generate(self) -> None:
        stream_events = max(1, self.args.events // 5)
        common = ["--customers", str(self.args.customers)]
        run_step(
            "generate-batch",
            ["spark", "generate", *common, "--events", str(self.args.events - stream_events),
             "--seed", str(self.args.seed), "--bad-rows", "3", "--out", str(self.batch_in)],
            self.env, self.logs,
        )  # fmt: skip
        run_step(
            "generate-stream",
            ["spark", "generate", *common, "--events", str(stream_events),
             "--seed", str(self.args.seed + 1), "--out", str(self.arriving)],
            self.env, self.logs,
        )  # fmt: skip
        say(f"    {_count_files(self.batch_in)} files for the batch run in {self.batch_in}")
        say(f"    {_count_files(self.arriving)} files to arrive while the stream runs")

    def batch(self, crash_events: list[str] | None) -> None:
        args = self._batch_args(self.batch_in)
        child = Child("spark-batch", args, self.env, self.logs)
        if crash_events is not None:
            if not crash.kill_driver_mid_commit(child, self.engine, JOB, crash_events):
                crash_events.append("the batch run committed before it could be killed")
            child.wait()
            child = Child("spark-batch-restarted", args, self.env, self.logs)
            say("    restarted the batch run")
        watch(child, self._progress)
        child.check()

    def stream(self) -> None:
        raise NotImplementedError

    def run_clean_reference(self, url: str, engine: Engine) -> None:
        raise NotImplementedError

    # -- helpers -------------------------------------------------------------

    def _batch_args(self, input_dir: Path) -> list[str]:
        return ["spark", "run", JOB, "--mode", "batch", "--input", str(input_dir)]

    def _progress(self) -> str:
        with self.engine.connect() as conn:
            c = tally.committed_batches(conn, JOB)
        return (
            f"{c['batches']} batches committed, {c['result_rows']:,} invoices, "
            f"{c['effects_new']:,} effects enqueued"
        )


def _count_files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


def _unused(*_: Any) -> None:  # keep imports honest until stream() lands
    _ = (shutil, DemoFailed, tail, wait_until)
