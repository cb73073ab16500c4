"""``format("outbox")``'s writers: Spark's Python Data Source API on the sink's protocol.

The API has the protocol's shape (docs/design.md): ``write`` runs once per task
on an executor and returns a commit message; ``commit`` runs once on the driver
with the messages of the tasks that succeeded. So a task here does what the
sink's tasks do, with the same functions: check and write its effects straight
into the outbox, invisible (spark_outbox.spark.chunks), and stage its result
rows (spark_outbox.spark.executor); its message is its reports. ``commit`` runs
the sink's one commit transaction (spark_outbox.spark.source_commit).

- A batch write's run is registered on the driver before any task runs
  (``writer()``: the replay check, then ``begin_run``), as ``OutboxSink.write`` does.
- A stream's writer is made before the stream's batches exist, and Spark calls
  nothing of ours between a micro-batch's start and its tasks. Each task reads
  the micro-batch from Spark's local properties, which every task of a
  streaming query carries: the query id (kept in the checkpoint: the stream's
  identity), the batch number and the query's run id (new at every start).
  The batch id is ``<query id>/<n>``, as ``foreach_batch``'s; the run id is
  derived from ``(query run, n)``, so the tasks of one try share it and a
  restart's try gets another. The first task registers the run; a task that
  finds the marker writes nothing (a replay).

Executors import this module: psycopg2, pyarrow, orjson and the sink's executor
code only (an import-linter contract keeps it so); the driver's side is
imported inside ``commit`` and ``abort``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from spark_outbox.core import sqltext
from spark_outbox.spark.chunks import write_effects
from spark_outbox.spark.executor import ResultStager, connect, task_id
from spark_outbox.spark.protocol import RunTag, TaskReport
from spark_outbox.spark.source_layout import Layout, split

_Q = sqltext.beside(__file__, "source_tasks.sql")
# Spark's local properties on every task of a streaming query's micro-batch.
QUERY_ID = "sql.streaming.queryId"
BATCH_NUMBER = "streaming.sql.batchId"
QUERY_RUN = "spark.jobGroup.id"  # StreamExecution sets the job group to the query's run id
# Run ids of stream batches: uuid5(this, "<query run>/<n>").
RUNS_NAMESPACE = uuid.UUID("5f0c6a34-6a1e-4d3e-9a39-0c1f0e1d2b7a")


@dataclasses.dataclass
class SourceMessage(WriterCommitMessage):
    """One task's commit message: which batch and run it wrote for, and its reports."""

    batch_id: str
    run_id: str
    replayed: bool = False
    effects: TaskReport = dataclasses.field(default_factory=TaskReport)
    results: TaskReport | None = None


@dataclasses.dataclass
class BatchWriter(DataSourceArrowWriter):
    """A batch write: ``run`` registered by ``writer()``; None when it was a replay."""

    options: Mapping[str, str]
    layout: Layout
    chunk_rows: int
    batch_id: str
    run: RunTag | None

    def write(self, iterator: Iterator[Any]) -> SourceMessage:
        if self.run is None:  # the marker exists: nothing of the batch is computed
            return SourceMessage(self.batch_id, "", replayed=True)
        conn = connect(self.run.dsn, "source")
        try:
            return write_task(conn, self.run, self.layout, iterator, self.chunk_rows)
        finally:
            conn.close()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from spark_outbox.spark import source_commit

        source_commit.commit_batch(self.options, self.layout, self.batch_id, self.run, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        from spark_outbox.spark import source_commit

        source_commit.abandon(self.options, self.run.run_id if self.run else None)


@dataclasses.dataclass
class StreamWriter(DataSourceStreamArrowWriter):
    """A stream's writer: each micro-batch's tasks find their batch and run (above)."""

    options: Mapping[str, str]
    layout: Layout
    chunk_rows: int
    dsn: str
    job: str

    def write(self, iterator: Iterator[Any]) -> SourceMessage:
        batch_id, run_id = stream_batch()
        conn = connect(self.dsn, "source")
        try:
            endpoints = begin_stream_run(conn, self.job, batch_id, run_id)
            if endpoints is None:
                return SourceMessage(batch_id, run_id, replayed=True)
            run = RunTag(self.dsn, self.job, batch_id, run_id, endpoints)
            return write_task(conn, run, self.layout, iterator, self.chunk_rows)
        finally:
            conn.close()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from spark_outbox.spark import source_commit

        source_commit.commit_stream(self.options, self.layout, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from spark_outbox.spark import source_commit

        for run_id in {m.run_id for m in messages if isinstance(m, SourceMessage) and m.run_id}:
            source_commit.abandon(self.options, run_id)


def write_task(
    conn: Any, run: RunTag, layout: Layout, batches: Iterator[Any], chunk_rows: int
) -> SourceMessage:
    """One task: its effects into the outbox (invisible), its result rows staged."""
    task = task_id()
    stager = ResultStager(connect(run.dsn, "results"), run, task) if layout.with_results else None
    try:

        def effects() -> Iterator[Any]:
            for batch in batches:
                found, rows = split(batch, layout)
                if stager is not None and len(rows):
                    stager.add(rows)
                yield found

        written = write_effects(conn, run, task, effects(), chunk_rows)
        results = stager.finish() if stager is not None else None
    finally:
        if stager is not None:
            stager.conn.close()
    return SourceMessage(run.batch_id, run.run_id, effects=written, results=results)


def stream_batch() -> tuple[str, str]:
    """(batch id, run id) of the micro-batch this task belongs to, from Spark's local
    properties; refused outside a streaming query: never a guessed identity."""
    from pyspark import TaskContext

    from spark_outbox.core.errors import ConfigurationError

    context = TaskContext.get()
    found = [context.getLocalProperty(p) if context else None for p in (QUERY_ID, BATCH_NUMBER)]
    query_run = context.getLocalProperty(QUERY_RUN) if context else None
    if not all(found) or not query_run:
        raise ConfigurationError(
            "format('outbox') stream writer: this task carries no streaming query's id, "
            "batch number and run (Spark's local properties); write through "
            "writeStream.format('outbox') with a checkpointLocation"
        )
    query_id, number = found
    return f"{query_id}/{number}", str(uuid.uuid5(RUNS_NAMESPACE, f"{query_run}/{number}"))


def begin_stream_run(conn: Any, job: str, batch_id: str, run_id: str) -> dict[str, str] | None:
    """Register the run (once for all its tasks) and read the endpoint kinds; None
    when the batch committed before (a replay)."""
    params = {"job": job, "batch_id": batch_id, "run_id": run_id}
    with conn, conn.cursor() as cur:
        cur.execute(_Q["read_marker"], params)
        if cur.fetchone() is not None:
            return None
        cur.execute(_Q["begin_run"], params)
        cur.execute(_Q["endpoint_kinds"])
        return {str(name): str(kind) for name, kind in cur.fetchall()}
