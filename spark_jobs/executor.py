"""Code that runs on Spark executors: nothing heavier than psycopg2, pyarrow and the
dispatcher's validation and key helpers (an import-linter contract keeps it so).

Each partition of effects checks its rows (spark_jobs.checks) and writes them
straight into the outbox, in chunks of ``CHUNK_ROWS``, one transaction each:
COPY into a temporary table, then one insert into ``effects`` tagged with the
run, invisible until the run's marker commits (the ``visible_effects`` view).
Keys already taken are classified (executor.sql, ``classify_taken``); a key
held by another run without a marker is deferred, never swallowed. Rejects and
result rows are staged for the commit transaction. Every task reports its
counts; the driver uses only the reports of the tasks Spark saw succeed.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from dispatcher import sqltext
from spark_jobs.checks import checked_effects

_Q = sqltext.beside(__file__, "executor.sql")
CHUNK_ROWS = 50_000
# What each task reports to the driver.
REPORT_SCHEMA = "task_id long, rows long, mismatches long, deferred long, rejects long"
_REPORT_FIELDS = ("task_id", "rows", "mismatches", "deferred", "rejects")
# Two runs inserting overlapping keys in different orders can deadlock; PostgreSQL
# aborts one chunk, which is simply tried again (it is one transaction).
_DEADLOCK_TRIES = 5
# Test hook: pause a task after its first chunk committed (kill tests "mid-write").
PAUSE_ENV = "OUTBOX_SPARK_PAUSE_AT"


@dataclasses.dataclass(frozen=True)
class RunTag:
    """What every task of a run needs: where to write, and as whom."""

    dsn: str
    job: str
    batch_id: str
    run_id: str
    endpoints: Mapping[str, str]  # registered endpoint name -> kind, read once per batch


@dataclasses.dataclass
class TaskReport:
    task_id: int
    rows: int = 0  # valid effect rows (or result rows)
    mismatches: int = 0
    deferred: int = 0
    rejects: int = 0


Partitions = Callable[[Iterator[Any]], Iterator[Any]]


def effects_writer(run: RunTag, chunk_rows: int = CHUNK_ROWS) -> Partitions:
    """The ``mapInArrow`` function that writes one partition of effects."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        report = TaskReport(_task_id())
        conn = _connect(run.dsn, "effects")
        try:
            write_effects(conn, run, report, batches, chunk_rows)
        finally:
            conn.close()
        yield _as_batch(report)

    return write


def results_writer(run: RunTag) -> Partitions:
    """The ``mapInArrow`` function that stages one partition of result rows."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        report = TaskReport(_task_id())
        conn = _connect(run.dsn, "results")
        try:
            with conn, conn.cursor() as cur:
                for batch in batches:
                    n = batch.num_rows
                    tagged = pa.table(
                        {
                            "run_id": pa.repeat(pa.scalar(run.run_id), n),
                            "task_id": pa.repeat(pa.scalar(report.task_id, pa.int64()), n),
                            "row": batch.column(0),
                        }
                    )
                    cur.copy_expert(_Q["stage_results"], _csv(tagged))
                    report.rows += n
        finally:
            conn.close()
        yield _as_batch(report)

    return write


def write_effects(
    conn: Any, run: RunTag, report: TaskReport, batches: Iterable[Any], chunk_rows: int
) -> None:
    """Check and write ``batches`` in chunks of about ``chunk_rows`` rows."""
    import pyarrow as pa

    with conn.cursor() as cur:
        cur.execute(_Q["create_incoming"])
    conn.commit()
    chunk = _Chunk(conn, run, report)
    valid: list[Any] = []
    rejects: list[Any] = []
    for batch in batches:
        good, bad = checked_effects(batch, run.endpoints)
        valid.append(good)
        rejects.append(bad)
        if sum(t.num_rows for t in valid) + sum(t.num_rows for t in rejects) >= chunk_rows:
            chunk.write(pa.concat_tables(valid), pa.concat_tables(rejects))
            valid, rejects = [], []
    if valid:
        chunk.write(pa.concat_tables(valid), pa.concat_tables(rejects))


class _Chunk:
    """Writes one chunk per transaction; remembers whether keys were ever taken."""

    def __init__(self, conn: Any, run: RunTag, report: TaskReport) -> None:
        self.conn = conn
        self.report = report
        self.params = {
            "job": run.job,
            "batch_id": run.batch_id,
            "run_id": run.run_id,
            "task_id": report.task_id,
        }
        self.optimistic = True  # plain INSERT until a key turns out to be taken
        self.written = 0

    def write(self, valid: Any, rejects: Any) -> None:
        import psycopg2.errors

        valid_csv, rejects_csv = _csv(valid).getvalue(), self._rejects_csv(rejects)
        for attempt in range(_DEADLOCK_TRIES):
            try:
                counts = self._once(valid_csv, valid.num_rows, rejects_csv)
                break
            except psycopg2.errors.DeadlockDetected:
                self.conn.rollback()
                if attempt == _DEADLOCK_TRIES - 1:
                    raise
        self.report.rows += valid.num_rows
        self.report.mismatches += counts[0]
        self.report.deferred += counts[1]
        self.report.rejects += rejects.num_rows
        self.written += 1
        if self.written == 1:
            _maybe_pause("effects_written")

    def _once(self, valid_csv: bytes, n_valid: int, rejects_csv: bytes | None) -> tuple[int, int]:
        counts = (0, 0)
        with self.conn.cursor() as cur:
            if n_valid:
                cur.copy_expert(_Q["copy_incoming"], io.BytesIO(valid_csv))
                if self._insert(cur) < n_valid:
                    cur.execute(_Q["classify_taken"], self.params)
                    mismatches, deferred = cur.fetchone()
                    counts = (int(mismatches), int(deferred))
            if rejects_csv is not None:
                cur.copy_expert(_Q["stage_rejects"], io.BytesIO(rejects_csv))
        self.conn.commit()
        return counts

    def _insert(self, cur: Any) -> int:
        import psycopg2.errors

        if self.optimistic:
            cur.execute("SAVEPOINT fast_insert")
            try:
                cur.execute(_Q["insert_new"], self.params)
                return int(cur.rowcount)
            except psycopg2.errors.UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT fast_insert")
                self.optimistic = False
        cur.execute(_Q["insert_effects"], self.params)
        return int(cur.rowcount)

    def _rejects_csv(self, rejects: Any) -> bytes | None:
        import pyarrow as pa

        n = rejects.num_rows
        if not n:
            return None
        tagged = pa.table(
            {
                "run_id": pa.repeat(pa.scalar(self.params["run_id"]), n),
                "task_id": pa.repeat(pa.scalar(self.report.task_id, pa.int64()), n),
                "reason": rejects.column("reason"),
                "raw_row": rejects.column("raw_row"),
            }
        )
        return _csv(tagged).getvalue()


def _csv(table: Any) -> io.BytesIO:
    """Arrow quotes every string and leaves nulls unquoted and empty: in
    PostgreSQL's CSV that is '' for an empty string and NULL for null."""
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    return buffer


def _connect(dsn: str, kind: str) -> Any:
    import psycopg2

    return psycopg2.connect(dsn, application_name=f"spark-outbox-write-{kind}")


def _task_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.taskAttemptId()) if context is not None else 0


def _as_batch(report: TaskReport) -> Any:
    import pyarrow as pa

    values = dataclasses.asdict(report)
    return pa.RecordBatch.from_pydict(
        {name: [values[name]] for name in _REPORT_FIELDS},
        schema=pa.schema([(name, pa.int64()) for name in _REPORT_FIELDS]),
    )


def _maybe_pause(phase: str) -> None:
    """Test hook: print a marker and pause so a kill test can kill this task here."""
    if os.environ.get(PAUSE_ENV) == phase:
        print(f"outbox-phase: {phase} (executor pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("OUTBOX_SPARK_PAUSE_S", "30")))
