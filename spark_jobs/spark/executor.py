"""The Spark tasks of a batch write: nothing heavier than psycopg2, pyarrow and the
dispatcher's validation and key helpers (an import-linter contract keeps it so).

One ``mapInArrow`` task per partition of effects writes them straight into the
outbox in chunks of ``CHUNK_ROWS`` (spark_outbox.spark.chunks), invisible until the
run's marker commits (the ``visible_effects`` view); one task per partition of
results stages its rows for the commit transaction. Every task reports its
counts; the driver uses only the reports of the tasks Spark saw succeed
(``collect`` returns nothing else).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from spark_outbox.core import sqltext
from spark_outbox.spark.chunks import csv, write_effects
from spark_outbox.spark.protocol import RunTag, TaskReport

_Q = sqltext.beside(__file__, "executor.sql")
CHUNK_ROWS = 50_000

Partitions = Callable[[Iterator[Any]], Iterator[Any]]


def effects_writer(run: RunTag, chunk_rows: int = CHUNK_ROWS) -> Partitions:
    """The ``mapInArrow`` function that writes one partition of effects."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        started_at = time.time()
        conn = _connect(run.dsn, "effects")
        try:
            report = write_effects(conn, run, _task_id(), batches, chunk_rows)
        finally:
            conn.close()
        yield dataclasses.replace(report, started_at=started_at, ended_at=time.time()).to_batch()

    return write


def results_writer(run: RunTag) -> Partitions:
    """The ``mapInArrow`` function that stages one partition of result rows."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        started_at = time.time()
        conn = _connect(run.dsn, "results")
        try:
            stager = ResultStager(conn, run, _task_id())
            for batch in batches:
                stager.add(batch.column(0))
            report = stager.finish()
        finally:
            conn.close()
        yield dataclasses.replace(report, started_at=started_at, ended_at=time.time()).to_batch()

    return write


class ResultStager:
    """Stages result rows (Arrow arrays of JSON text) for the commit transaction, all
    in one transaction that ``finish`` commits (a failed task leaves none)."""

    def __init__(self, conn: Any, run: RunTag, task_id: int) -> None:
        self.conn = conn
        self.run = run
        self.task_id = task_id
        self.rows = 0

    def add(self, texts: Any) -> None:
        import pyarrow as pa

        n = len(texts)
        tagged = pa.table(
            {
                "run_id": pa.repeat(pa.scalar(self.run.run_id), n),
                "task_id": pa.repeat(pa.scalar(self.task_id, pa.int64()), n),
                "row": texts,
            }
        )
        with self.conn.cursor() as cur:
            cur.copy_expert(_Q["stage_results"], csv(tagged))
        self.rows += n

    def finish(self) -> TaskReport:
        self.conn.commit()
        return TaskReport(self.task_id, rows=self.rows)


def connect(dsn: str, kind: str) -> Any:
    """An executor's connection, its errors terse; ``kind`` names it in pg_stat_activity."""
    return _connect(dsn, kind)


def task_id() -> int:
    """This task attempt's id: the driver finds the attempt's staged rows by it."""
    return _task_id()


def _connect(dsn: str, kind: str) -> Any:
    import psycopg2

    from spark_outbox.core.pgterse import make_terse

    conn = psycopg2.connect(dsn, application_name=f"spark-outbox-write-{kind}")
    make_terse(conn)  # a failed COPY's message would quote the row
    return conn


def _task_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.taskAttemptId()) if context is not None else 0
