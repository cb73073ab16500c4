"""The outbox sink: a batch's results and effects become visible in ONE commit.

Two ways in: ``OutboxSink.write(results_df, effects_df, batch_id=...)`` for batch
jobs (the batch id is a run id such as the logical date), and
``OutboxSink.foreach_batch(derive)`` for Structured Streaming, where
``derive(batch_df, batch_id)`` turns the micro-batch into ``(results_df, effects_df)``.

Protocol (docs/design.md): a batch whose marker exists is a replay and is skipped;
otherwise executors stage rows in parallel under a fresh run id, and the
driver commits them in one transaction fenced by the marker (spark_jobs.commit).
Executors commit staging in chunks, and the commit transaction (marker first)
merges each chunk as it lands, so staging and merging overlap
(``commit.commit_pipelined``). Small batches skip the executors' staging: the
driver streams them into the staging tables inside the commit transaction
itself (same SQL, same result).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from dispatcher import db
from dispatcher.errors import ConfigurationError
from spark_jobs import commit as store
from spark_jobs import phases
from spark_jobs.contract import effect_frame, result_frame
from spark_jobs.executor import CHUNK_ROWS, STAGED_SCHEMA, stage, stage_partition
from spark_jobs.results import ResultsSpec

log = logging.getLogger(__name__)
Derive = Callable[[Any, str], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class OutboxSink:
    job: str
    database_url: str
    results: ResultsSpec | None = None
    # "reject": bad effect rows go to rejects, good ones commit; "fail": abort the batch.
    on_invalid: str = "reject"
    # "auto": the driver path up to driver_path_max_rows rows, executors above.
    path: str = "auto"
    driver_path_max_rows: int = 10_000
    # Rows per staging chunk on the executors: the commit merges a chunk as soon
    # as it lands, so smaller chunks overlap more, at one transaction each.
    chunk_rows: int = CHUNK_ROWS
    abandoned_after_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.on_invalid not in ("reject", "fail"):
            raise ConfigurationError(f"on_invalid={self.on_invalid!r}: use 'reject' or 'fail'")
        if self.path not in ("auto", "executors", "driver"):
            raise ConfigurationError(f"path={self.path!r}: use 'auto', 'executors' or 'driver'")

    def foreach_batch(
        self, derive: Derive, stream_id: Callable[[], str] | None = None
    ) -> Callable[[Any, int], None]:
        """A ``foreachBatch`` callable: the micro-batch is persisted once, then derived.

        ``stream_id`` names the checkpoint (e.g. the query id stored in it): the batch
        id becomes ``<stream_id>/<n>``, so a query restarted from its checkpoint
        replays its batch ids while a fresh checkpoint starts new ones (whose
        effects then deduplicate by key, showing changed input as mismatches).
        """

        def run(batch_df: Any, spark_batch_id: int) -> None:
            batch_id = f"{stream_id()}/{spark_batch_id}" if stream_id else str(spark_batch_id)
            engine = store.engine_for(self.database_url)
            try:
                if store.read_outcome(engine, self.job, batch_id, "replayed") is not None:
                    self._log_replay(batch_id)
                    return
            finally:
                engine.dispose()
            # Materialised once, lineage cut: results and effects come from one
            # computation. (persist() here trips Spark when the derived frames are
            # persisted again: "key not found" in InMemoryRelation.)
            frozen = batch_df.localCheckpoint(eager=True)
            results_df, effects_df = derive(frozen, batch_id)
            self.write(results_df, effects_df, batch_id=batch_id)

        return run

    def replay_of(self, batch_id: str) -> store.BatchOutcome | None:
        """The committed outcome of ``batch_id``, or None: lets a job skip reading its input."""
        engine = store.engine_for(self.database_url)
        try:
            return store.read_outcome(engine, self.job, batch_id, "replayed")
        finally:
            engine.dispose()

    def write(self, results_df: Any, effects_df: Any, *, batch_id: str) -> store.BatchOutcome:
        """Commit one batch; a replayed batch id writes nothing and says so."""
        engine = store.engine_for(self.database_url)
        try:
            replay = store.read_outcome(engine, self.job, batch_id, "replayed")
            if replay is not None:
                self._log_replay(batch_id)
                return replay
            return self._write(engine, results_df, effects_df, batch_id)
        finally:
            engine.dispose()

    def _write(self, engine: Any, results_df: Any, effects_df: Any, batch_id: str) -> Any:
        # Only "auto" reads the frames twice (a count to choose the path, then the
        # staging), so only "auto" caches them: for a one-pass path, building the
        # cache cost more than the staging itself (bench: ~9 s per 1M effects).
        cache = self.path == "auto"
        effects = _cached(effect_frame(effects_df), cache)
        results = _cached(result_frame(results_df), cache) if results_df is not None else None
        try:
            request = store.CommitRequest(
                job=self.job,
                batch_id=batch_id,
                results=self.results if results is not None else None,
                result_columns=tuple(results_df.columns) if results_df is not None else (),
                on_invalid=self.on_invalid,
                spark_app_id=effects_df.sparkSession.sparkContext.applicationId,
            )
            run_id = store.begin_run(engine, self.job, batch_id, self.abandoned_after_s)
            phases.reached("staging")
            if self._use_driver(effects, results):
                outcome = self._commit_through_driver(engine, request, run_id, effects, results)
            else:
                outcome = store.commit_pipelined(
                    engine,
                    request,
                    run_id,
                    lambda: self._stage_on_executors(run_id, effects, results),
                )
        finally:
            if cache:
                effects.unpersist()
                if results is not None:
                    results.unpersist()
        # Our own rows on a lost race, and any zombie's rows for a committed batch.
        store.sweep(engine, self.abandoned_after_s)
        log.info(
            "batch %s", outcome.status, extra={"event": f"batch.{outcome.status}", **vars(outcome)}
        )
        return outcome

    def _use_driver(self, effects: Any, results: Any) -> bool:
        if self.path != "auto":
            return self.path == "driver"
        rows = effects.count() + (results.count() if results is not None else 0)
        return rows <= self.driver_path_max_rows

    def _stage_on_executors(self, run_id: str, effects: Any, results: Any) -> store.Staged:
        def run(kind: str, frame: Any) -> list[Any]:
            if frame is None:
                return []
            dsn = db.libpq_url(self.database_url)
            stage_fn = stage_partition(dsn, run_id, kind, self.chunk_rows)
            return frame.mapInArrow(stage_fn, STAGED_SCHEMA).collect()

        fx, rs = run("effects", effects), run("results", results)
        return store.Staged(
            run_id=run_id,
            effect_tasks=tuple(r["task_id"] for r in fx),
            result_tasks=tuple(r["task_id"] for r in rs),
            effect_rows=sum(r["rows"] for r in fx),
            result_rows=sum(r["rows"] for r in rs),
        )

    def _commit_through_driver(
        self, engine: Any, request: Any, run_id: str, effects: Any, results: Any
    ) -> store.BatchOutcome:
        effect_batches = effects.toArrow().to_batches()
        result_batches = results.toArrow().to_batches() if results is not None else []

        def stage_in_tx(cursor: Any) -> store.Staged:
            return store.Staged(
                run_id=run_id,
                effect_tasks=(0,),
                result_tasks=(0,),
                effect_rows=stage(cursor, "effects", effect_batches, run_id, 0),
                result_rows=stage(cursor, "results", result_batches, run_id, 0),
            )

        return store.commit(engine, request, store.Staged(run_id), stage_in_tx)

    def _log_replay(self, batch_id: str) -> None:
        log.info(
            "batch already committed: replay skipped",
            extra={"event": "batch.replayed", "job": self.job, "batch_id": batch_id},
        )


def _cached(frame: Any, cache: bool) -> Any:
    return frame.persist() if cache else frame
