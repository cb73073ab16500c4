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
        import pyarrow as pa

        started_at = time.time()
        task_id = _task_id()
        rows = 0
        conn = _connect(run.dsn, "results")
        try:
            with conn, conn.cursor() as cur:
                for batch in batches:
                    n = batch.num_rows
                    tagged = pa.table(
                        {
                            "run_id": pa.repeat(pa.scalar(run.run_id), n),
                            "task_id": pa.repeat(pa.scalar(task_id, pa.int64()), n),
                            "row": batch.column(0),
                        }
                    )
                    cur.copy_expert(_Q["stage_results"], csv(tagged))
                    rows += n
        finally:
            conn.close()
        report = TaskReport(task_id, rows=rows, started_at=started_at, ended_at=time.time())
        yield report.to_batch()

    return write


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
