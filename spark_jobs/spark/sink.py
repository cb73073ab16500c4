"""The outbox sink: a batch's results, effects and rejects become visible in ONE commit.

Two ways in: ``OutboxSink.write(results_df, effects_df, batch_id=...)`` for batch
jobs (the batch id is a run id such as the logical date), and
``OutboxSink.foreach_batch(derive)`` for Structured Streaming, where
``derive(batch_df, batch_id)`` turns the micro-batch into ``(results_df, effects_df)``
and the batch id carries the stream's checkpoint identity (see streams.py).

``write`` is the protocol, top to bottom (docs/design.md): a batch whose marker
exists is a replay and writes nothing; otherwise a fresh run is registered, the
executors write the effects straight into the outbox in parallel (invisible
until the run's marker commits) and stage the result rows and rejects, and the
driver runs the one commit transaction (spark_outbox.spark.commit). Visibility, not
placement, is atomic: the marker's COMMIT makes everything of the run visible at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_outbox.core import db, tracing
from spark_outbox.core.errors import ConfigurationError, DatabaseUnavailable, OutboxError
from spark_outbox.spark import commit, phases, preview, runs, sessions, spans
from spark_outbox.spark.contract import effect_frame, result_frame
from spark_outbox.spark.executor import CHUNK_ROWS, effects_writer, results_writer
from spark_outbox.spark.guard import VolumeGuard
from spark_outbox.spark.outcome import BatchCounts, BatchInterrupted, BatchOutcome, Marker
from spark_outbox.spark.preview import BatchPreview
from spark_outbox.spark.protocol import REPORT_SCHEMA, RunTag, TaskReport
from spark_outbox.spark.results import ResultsSpec
from spark_outbox.spark.streams import stream_batch_id

log = logging.getLogger(__name__)
# Executor connections a batch may hold at once (OutboxSink.max_connections).
DEFAULT_MAX_CONNECTIONS = 16
# Tries at a batch when the database goes away mid-write: the first, and two more.
WRITE_ATTEMPTS = 3
# What Spark says when a task needs a localCheckpoint block no live executor holds.
LOST_CHECKPOINT = "Checkpoint block"
# (micro-batch, its batch id) -> (results or None, effects); DataFrames are untyped here.
Derive = Callable[[Any, str], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class OutboxSink:
    job: str
    database_url: str
    results: ResultsSpec | None = None
    # "reject": bad effect rows go to rejects, good ones commit; "fail": abort the batch.
    on_invalid: str = "reject"
    # Effect rows per executor transaction (COPY into a temp table, one insert).
    chunk_rows: int = CHUNK_ROWS
    # A run older than this that has not committed is swept with its rows.
    abandoned_after_s: float = 3600.0
    # At most this many executor tasks write at once, each on its own connection: a
    # frame with more partitions is coalesced to this many (as Spark's JDBC writer
    # does with numPartitions), so 200 partitions never open 200 connections.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # A database outage (a restart, a crash) shorter than this is waited out mid-write,
    # and the batch written again; a longer one fails the write (nothing committed).
    outage_s: float = 120.0
    # Holds an outsized batch for an operator (guard.py); VolumeGuard.off() disables.
    volume_guard: VolumeGuard = dataclasses.field(default_factory=VolumeGuard)

    def __post_init__(self) -> None:
        db.check_url(self.database_url, "database_url")  # at construction, not mid-batch
        if self.on_invalid not in ("reject", "fail"):
            raise ConfigurationError(f"on_invalid={self.on_invalid!r}: use 'reject' or 'fail'")
        bound = self.max_connections
        if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= 10_000:
            raise ConfigurationError(
                f"max_connections={bound!r}: use a whole number from 1 to 10000 (at most the "
                "connections PostgreSQL or the pooler in front of it grants the sink)"
            )

    def foreach_batch(
        self, derive: Derive, *, checkpoint: str | Path | None = None
    ) -> Callable[[Any, int], None]:
        """A ``foreachBatch`` callable; batch ids are ``<query id>/<n>`` (see streams.py).

        ``checkpoint``: read the query id from ``<checkpoint>/metadata`` instead of
        Spark's thread-local property (both name the same checkpoint).
        """

        def run(batch_df: Any, spark_batch_id: int) -> None:
            batch_id = stream_batch_id(batch_df, spark_batch_id, checkpoint)
            if self.replayed(batch_id) is not None:
                # Written nowhere, but computed: a stateful query's state stores commit
                # only once every partition ran (Spark refuses the batch otherwise).
                batch_df.write.format("noop").mode("append").save()
                return
            for attempt in range(1, WRITE_ATTEMPTS + 1):
                frozen = _materialised(batch_df)
                try:
                    results_df, effects_df = derive(frozen, batch_id)
                    self.write(results_df, effects_df, batch_id=batch_id)
                    return
                except Exception as exc:
                    if attempt == WRITE_ATTEMPTS or LOST_CHECKPOINT not in str(exc):
                        raise
                    log.warning(
                        "micro-batch copy lost with an executor; materialising it again",
                        extra={"event": "batch.rematerialised", "batch_id": batch_id},
                    )

        return run

    def replayed(self, batch_id: str) -> BatchOutcome | None:
        """The outcome of a replay (logged) if ``batch_id`` committed before, else None:
        lets a job skip reading its input."""
        engine = runs.engine_for(self.database_url)
        try:
            original = runs.read_marker(engine, self.job, batch_id)
        finally:
            engine.dispose()
        return None if original is None else self._log(self._replayed(batch_id, original))

    def write(self, results_df: Any, effects_df: Any, *, batch_id: str) -> BatchOutcome:
        """Commit one batch; a replayed batch id writes nothing and says so.

        A database outage mid-write (a restart, a crash) is ridden out: the sink waits
        up to ``outage_s`` for the database and writes the batch again, as a new run
        (the marker says first whether an earlier run of this call committed it).
        """
        with spans.batch(self.job, batch_id) as span:
            outcome = self._write(results_df, effects_df, batch_id, span)
            spans.outcome(span, outcome)
        return self._log(outcome)

    def _write(self, results_df: Any, effects_df: Any, batch_id: str, span: Any) -> BatchOutcome:
        ours: list[str] = []  # the runs this call began
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return self._write_once(results_df, effects_df, batch_id, span, ours)
            except (DatabaseUnavailable, BatchInterrupted) as exc:
                if attempt == WRITE_ATTEMPTS:
                    raise
                log.warning(
                    "batch write interrupted by the database; writing it again",
                    extra={
                        "event": "batch.interrupted",
                        "batch_id": batch_id,
                        "error": str(exc)[:200],
                    },
                )
                runs.wait_for_database(self.database_url, self.outage_s)
        raise AssertionError("unreachable")

    def _write_once(
        self, results_df: Any, effects_df: Any, batch_id: str, span: Any, ours: list[str]
    ) -> BatchOutcome:
        engine = runs.engine_for(self.database_url)
        try:
            original = runs.read_marker(engine, self.job, batch_id)
            if original is not None and original.run_id in ours:  # committed; the ack was lost
                return self._committed_earlier(batch_id, original)
            if original is not None:
                return self._replayed(batch_id, original)
            endpoints = runs.endpoint_kinds(engine)
            run_id = runs.begin_run(engine, self.job, batch_id)
            ours.append(run_id)
            spans.run(span, run_id)
            run = RunTag(db.libpq_url(self.database_url), self.job, batch_id, run_id, endpoints)
            request = self._request(run, results_df, effects_df, span)
            try:
                phases.reached("writing")
                with tracing.span("outbox.write"):
                    written = self._write_on_executors(run, results_df, effects_df)
                    spans.tasks(written.effect_tasks, "effects")
                    spans.tasks(written.result_tasks, "results")
                phases.reached("written")
                with tracing.span("outbox.commit") as commit_span:
                    outcome = commit.commit(engine, request, written)
                    spans.outcome(commit_span, outcome)
            except Exception:
                _abandon_quietly(engine, run_id)
                raise
            runs.sweep(engine, self.abandoned_after_s)  # e.g. our rows, when we lost a race
        finally:
            engine.dispose()
        return outcome

    def preview(self, results_df: Any, effects_df: Any, *, batch_id: str) -> BatchPreview:
        """What ``write`` would do with this batch, computed in full, written nowhere
        (spark_outbox.spark.preview): new, same-payload and changed keys, rejects, the guard."""
        return preview.preview(
            self.job,
            self.database_url,
            self.volume_guard,
            results_df,
            effects_df,
            batch_id,
            max_connections=self.max_connections,
        )

    def _write_on_executors(self, run: RunTag, results_df: Any, effects_df: Any) -> commit.Written:
        """Effects into the outbox, results and rejects into staging: one Spark job each.

        ``collect`` returns the reports of the task attempts that succeeded only.
        """
        bound = self.max_connections
        effects = (
            effect_frame(effects_df)
            .coalesce(bound)
            .mapInArrow(effects_writer(run, self.chunk_rows), REPORT_SCHEMA)
        )
        effect_tasks = tuple(TaskReport.from_row(row) for row in effects.collect())
        result_tasks: tuple[TaskReport, ...] = ()
        if results_df is not None:
            results = (
                result_frame(results_df)
                .coalesce(bound)
                .mapInArrow(results_writer(run), REPORT_SCHEMA)
            )
            result_tasks = tuple(TaskReport.from_row(row) for row in results.collect())
        return commit.Written(effect_tasks, result_tasks)

    def _request(
        self, run: RunTag, results_df: Any, effects_df: Any, span: Any
    ) -> commit.CommitRequest:
        return commit.CommitRequest(
            job=self.job,
            batch_id=run.batch_id,
            run_id=run.run_id,
            results=self.results if results_df is not None else None,
            result_columns=tuple(results_df.columns) if results_df is not None else (),
            on_invalid=self.on_invalid,
            spark_app_id=sessions.application_id(effects_df.sparkSession),
            volume_guard=self.volume_guard,
            trace=tracing.carrier(span) if span is not None else None,
        )

    def _replayed(self, batch_id: str, original: Marker) -> BatchOutcome:
        return BatchOutcome(
            job=self.job, batch_id=batch_id, status="replayed", run_id=None, original=original
        )

    def _committed_earlier(self, batch_id: str, marker: Marker) -> BatchOutcome:
        counts = {f.name: getattr(marker, f.name) for f in dataclasses.fields(BatchCounts)}
        return BatchOutcome(
            job=self.job,
            batch_id=batch_id,
            status="committed",
            run_id=marker.run_id,
            resolved_by_marker=True,
            held_reason=marker.hold_reason,
            **counts,
        )

    def _log(self, outcome: BatchOutcome) -> BatchOutcome:
        fields = dataclasses.asdict(outcome)
        log.info("batch %s", outcome.status, extra={"event": f"batch.{outcome.status}", **fields})
        return outcome


def _materialised(batch_df: Any) -> Any:
    """The micro-batch computed once, lineage cut: results and effects come from one
    computation (``persist`` is no way: Spark fails to cache a stateful micro-batch's
    plan). On a cluster each block is kept on two executors, so one executor lost
    mid-batch does not take the batch's only copy with it; if every copy is lost,
    ``foreach_batch`` computes it again from the micro-batch (the same offsets)."""
    from pyspark import StorageLevel

    try:
        local = str(batch_df.sparkSession.sparkContext.master).startswith("local")
    except Exception:  # no sparkContext (Spark Connect): the server decides
        local = False
    level = StorageLevel.MEMORY_AND_DISK if local else StorageLevel.MEMORY_AND_DISK_2
    return batch_df.localCheckpoint(eager=True, storageLevel=level)


def _abandon_quietly(engine: Any, run_id: str) -> None:
    """The write failed: sweep the run's rows now (the database may be gone: then later)."""
    with contextlib.suppress(OutboxError):
        runs.abandon(engine, run_id)
