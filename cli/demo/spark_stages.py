"""The Spark side of the demo: usage data, the billing job in batch, then streaming.

The generator writes one file per day. The first days are billed in batch mode
(``--date`` per day, one batch each). The later days *arrive* while the
streaming query runs: the demo moves them into its input directory one by
one and waits until the query has committed each (read from the query's
checkpoint), then stops it with SIGTERM. Every run is ``outbox spark ...`` as
its own process (driver + local JVM), so ``--crash`` can SIGKILL a driver
mid-commit and run it again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import crash, guard, tally
from spark_outbox.cli.demo.procs import Child, DemoFailed, run_step, tail
from spark_outbox.cli.demo.progress import Stopwatch, say, watch

BATCH_JOB = "billing"
STREAM_JOBS = ("billing.stream", "billing.stream.rejects")
STREAM_QUERIES = ("invoices", "rejects")
START = dt.date(2026, 1, 1)
BAD_ROWS = 10


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
        self.generated = data / "generated"
        self.batch_in = data / "usage-batch"
        self.stream_in = data / "usage-stream"
        self.checkpoint = data / "checkpoint"
        self.notes: list[str] = []
        self.batch_days, self.stream_days = args.batch_days, args.stream_days
        self.dates = [(START + dt.timedelta(days=d)).isoformat() for d in range(self.batch_days)]
        # One more day for the batch run, outsized: the volume guard holds it (demo.guard).
        self.outsized_date = (
            START + dt.timedelta(days=self.batch_days + self.stream_days)
        ).isoformat()

    def run_all(self, sw: Stopwatch, crash_events: list[str] | None) -> None:
        with sw.stage("generate usage data"):
            self.generate()
        with sw.stage("spark: billing job, batch mode"):
            self.batch(crash_events)
        with sw.stage("spark: billing job, streaming over arriving files"):
            self.stream()

    def generate(self) -> None:
        days = self.batch_days + self.stream_days
        step = run_step(
            "generate",
            ["spark", "generate", "--customers", str(self.args.customers),
             "--events", str(self.args.events), "--seed", str(self.args.seed),
             "--bad-rows", str(BAD_ROWS), "--days", str(days), "--start", START.isoformat(),
             "--out", str(self.generated)],
            self.env, self.logs,
        )  # fmt: skip
        made = json.loads(step.output())
        self.batch_in.mkdir(parents=True)
        for name in (f"events-{d}.json" for d in self.dates):
            shutil.copy2(self.generated / name, self.batch_in / name)
        self._generate_outsized_day(days)
        say(
            f"    {made['events']:,} events ({made['bad_rows']} planted bad rows) in "
            f"{len(made['files'])} daily files: {self.batch_days} for the batch run, "
            f"{self.stream_days} to arrive while the stream runs"
        )

    def batch(self, crash_events: list[str] | None, env: Mapping[str, str] | None = None) -> None:
        args = ["spark", "run", "billing", "--mode", "batch", "--input", str(self.batch_in)]
        args += [a for d in [*self.dates, self.outsized_date] for a in ("--date", d)]
        args += guard.guard_args(self.batch_days)
        env = env or self.env
        if crash_events is not None:
            paused = {**env, "OUTBOX_SPARK_PHASES": "before_commit:300"}
            victim = Child("spark-batch-crashed", args, paused, self.logs)
            crash.kill_driver_mid_commit(victim, self.engine, crash_events)
            say("    restarting the batch run")
        child = Child("spark-batch" if crash_events is None else "spark-batch-restarted",
                      args, env, self.logs)  # fmt: skip
        watch(child, self._progress)
        child.check()
        say(f"    {self._progress()}")

    def stream(self, env: Mapping[str, str] | None = None, waves: bool = True) -> None:
        """Start the query, let the files arrive one by one, stop it once all are committed."""
        self.stream_in.mkdir(parents=True, exist_ok=True)
        args = ["spark", "run", "billing", "--mode", "stream", "--input", str(self.stream_in),
                "--checkpoint", str(self.checkpoint)]  # fmt: skip
        child = Child("spark-stream", args, env or self.env, self.logs)
        try:
            arriving = sorted(set(self.generated.glob("events-*.json")) - set(self._batch_files()))
            if not waves:
                for path in arriving:
                    shutil.copy2(path, self.stream_in / path.name)
            for path in arriving:
                if waves:
                    tmp = self.stream_in / f".{path.name}.tmp"
                    shutil.copy2(path, tmp)
                    tmp.rename(self.stream_in / path.name)  # atomic: the query sees it whole
                    say(f"    arrived: {path.name}")
                last = path == arriving[-1]
                self._wait_committed(child, [p.name for p in arriving if p <= path], settle=last)
                say(f"    {self._progress()}")
        finally:
            code = child.stop()
        say(
            f"    the last day ({arriving[-1].name}) stays open: a streaming invoice is "
            "final only once a later event moves the watermark past its day"
        )
        if code == 0:
            say("    stream stopped with SIGTERM (exit 0); its checkpoint would resume it")
        else:
            # Every file was committed (checked in the checkpoint) before the SIGTERM, so
            # a non-zero exit here is a shutdown problem of `outbox spark run`, not lost data.
            self.notes.append(
                f"`outbox spark run billing --mode stream` exited {code} on SIGTERM after all "
                f"its batches had committed (log: {child.log_path})"
            )
            say(f"    note: {self.notes[-1]}")

    def _generate_outsized_day(self, days: int) -> None:
        """A day with CUSTOMERS_FACTOR times the customers, as dense in events as the others."""
        factor = guard.CUSTOMERS_FACTOR
        run_step(
            "generate-outsized",
            ["spark", "generate", "--customers", str(self.args.customers * factor),
             "--events", str(self.args.events * factor // days), "--seed", str(self.args.seed),
             "--days", "1", "--start", self.outsized_date, "--out", str(self.generated / "big")],
            self.env, self.logs,
        )  # fmt: skip
        name = f"events-{self.outsized_date}.json"
        shutil.copy2(self.generated / "big" / name, self.batch_in / name)
        say(f"    plus {name} with {factor}x the customers, for the volume guard to hold")

    def run_clean_reference(self, url: str, engine: Engine) -> None:
        """The same job on the same input, into another database, with a fresh checkpoint."""
        clean = SparkStages(self.args, {**self.env, "DATABASE_URL": url}, self.logs.parent /
                            "clean", self.logs / "clean", engine)  # fmt: skip
        clean.generated = self.generated
        clean.batch_in = self.batch_in
        clean.batch(None)
        clean.stream(waves=False)

    # -- helpers -------------------------------------------------------------

    def _batch_files(self) -> list[Path]:
        return [self.generated / f"events-{d}.json" for d in self.dates]

    def _wait_committed(
        self, child: Child, names: list[str], settle: bool, timeout_s: float = 300
    ) -> None:
        """Until both queries have read every file in ``names`` and committed.

        ``settle``: also wait until every day but the last is invoiced: the
        no-data batch that closes a window once the watermark moved has run.
        """
        deadline = time.monotonic() + timeout_s
        while not all(_caught_up(self.checkpoint / q, names) for q in STREAM_QUERIES):
            if not child.running():
                raise DemoFailed(f"the stream exited early:\n{tail(child.log_path)}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"the stream did not commit {names} in {timeout_s:.0f} s")
            time.sleep(0.5)
        if settle:
            self._wait_closed(child, names[:-1], deadline)
            self._wait_committed(child, names, settle=False, timeout_s=timeout_s)

    def _wait_closed(self, child: Child, names: list[str], deadline: float) -> None:
        """Until the stream has invoiced every day but the last (its window stays open)."""
        days = {n.removeprefix("events-").removesuffix(".json") for n in names}
        while True:
            with self.engine.connect() as conn:
                if days <= set(tally.invoice_dates(conn, STREAM_JOBS[0])):
                    return
            if not child.running():
                raise DemoFailed(f"the stream exited early:\n{tail(child.log_path)}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"the stream did not close the days {sorted(days)} in time")
            time.sleep(0.5)

    def _progress(self) -> str:
        with self.engine.connect() as conn:
            batch = tally.committed_batches(conn, BATCH_JOB)
            stream = tally.committed_batches(conn, STREAM_JOBS[0])
            rejects = tally.reject_count(conn)
        return (
            f"batch: {batch['batches']} batches, {batch['result_rows']:,} invoices; stream: "
            f"{stream['batches']} batches, {stream['result_rows']:,} invoices; "
            f"{batch['effects_new'] + stream['effects_new']:,} effects enqueued, "
            f"{rejects:,} rejects"
        )


def _caught_up(query_dir: Path, names: list[str]) -> bool:
    """The query's file log lists every name, and its last offset is committed."""
    seen = set()
    for log in (query_dir / "sources" / "0").glob("*"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                seen.add(Path(json.loads(line).get("path", "")).name)
    offsets = _batch_ids(query_dir / "offsets")
    commits = _batch_ids(query_dir / "commits")
    return set(names) <= seen and bool(commits) and max(commits) == max(offsets, default=-1)


def _batch_ids(path: Path) -> list[int]:
    return [int(p.name) for p in path.glob("*") if p.name.isdigit()] if path.is_dir() else []
