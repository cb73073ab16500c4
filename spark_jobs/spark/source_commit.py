"""The driver's side of ``format("outbox")``: the sink's own protocol steps, called
from Spark's data source callbacks (spark_outbox.spark.source_tasks).

A batch write: ``begin_batch`` (from ``writer()``, before any task runs) is the
replay check and the run's registration; ``commit_batch`` (Spark's ``commit``,
once, with the messages of the tasks that succeeded) is the one commit
transaction (spark_outbox.spark.commit) and the sweep. A stream: each
micro-batch's ``commit_stream`` learns the batch and the run from its tasks'
messages, then the same commit. A failed write (Spark's ``abort``) sweeps its
run at once. These run in Python processes Spark starts on the driver (the
Connect server's, under Connect): the outcome is logged and is the batch's
marker (``outbox batches``), not returned to the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from pyspark.sql.datasource import WriterCommitMessage
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.errors import OutboxError
from spark_outbox.spark import commit, runs
from spark_outbox.spark.outcome import BatchNotCommitted, BatchOutcome
from spark_outbox.spark.protocol import RunTag
from spark_outbox.spark.source_layout import Layout
from spark_outbox.spark.source_options import SourceOptions, database_url, parse
from spark_outbox.spark.source_tasks import SourceMessage

log = logging.getLogger(__name__)
Messages = Sequence[WriterCommitMessage | None]


def begin_batch(options: SourceOptions) -> RunTag | None:
    """The replay check, then a fresh run; None when the batch committed before."""
    assert options.batch_id is not None
    engine = runs.engine_for(options.database_url)
    try:
        if runs.read_marker(engine, options.job, options.batch_id) is not None:
            return None
        endpoints = runs.endpoint_kinds(engine)
        run_id = runs.begin_run(engine, options.job, options.batch_id)
    finally:
        engine.dispose()
    dsn = db.libpq_url(options.database_url)
    return RunTag(dsn, options.job, options.batch_id, run_id, endpoints)


def commit_batch(
    raw: Mapping[str, str], layout: Layout, batch_id: str, run: RunTag | None, messages: Messages
) -> BatchOutcome:
    options = parse(raw, streaming=False)
    if run is None:
        return _replayed(options, batch_id)
    return _commit(options, layout, batch_id, run.run_id, _ours(messages))


def commit_stream(
    raw: Mapping[str, str], layout: Layout, messages: Messages, number: int
) -> BatchOutcome | None:
    """One micro-batch's commit; None when it had no task (nothing was written)."""
    options = parse(raw, streaming=True)
    found = _ours(messages)
    batches = {(m.batch_id, m.run_id) for m in found if not m.replayed}
    replays = {m.batch_id for m in found if m.replayed}
    if len(batches) > 1 or any(not b.endswith(f"/{number}") for b, _ in batches):
        raise BatchNotCommitted(
            f"micro-batch {number}: its tasks wrote for {sorted(batches)}; nothing was "
            "committed, the stream's restart runs the batch again"
        )
    if not batches:
        if replays:
            return _replayed(options, replays.pop())
        log.info("empty micro-batch", extra={"event": "batch.empty", "number": number})
        return None
    ((batch_id, run_id),) = batches
    return _commit(options, layout, batch_id, run_id, [m for m in found if not m.replayed])


def abandon(raw: Mapping[str, str], run_id: str | None) -> None:
    """A write Spark gave up on: sweep its run now (the database may be gone: then later)."""
    if run_id is None:
        return
    engine = runs.engine_for(database_url(raw))
    try:
        runs.abandon(engine, run_id)
    except OutboxError:
        log.warning("abandoned run not swept yet", extra={"event": "batch.abandon_failed"})
    finally:
        engine.dispose()


def _commit(
    options: SourceOptions,
    layout: Layout,
    batch_id: str,
    run_id: str,
    messages: list[SourceMessage],
) -> BatchOutcome:
    written = commit.Written(
        tuple(m.effects for m in messages),
        tuple(m.results for m in messages if m.results is not None),
    )
    request = commit.CommitRequest(
        job=options.job,
        batch_id=batch_id,
        run_id=run_id,
        results=options.results,
        result_columns=layout.result_columns,
        on_invalid=options.on_invalid,
        volume_guard=options.volume_guard,
    )
    engine = runs.engine_for(options.database_url)
    try:
        try:
            outcome = commit.commit(engine, request, written)
        except Exception:
            _abandon_quietly(engine, run_id)
            raise
        runs.sweep(engine, options.abandoned_after_s)
    finally:
        engine.dispose()
    return _log(outcome)


def _ours(messages: Messages) -> list[SourceMessage]:
    """The messages of the tasks that succeeded (Spark passes None for the others)."""
    return [m for m in messages if isinstance(m, SourceMessage)]


def _replayed(options: SourceOptions, batch_id: str) -> BatchOutcome:
    engine = runs.engine_for(options.database_url)
    try:
        original = runs.read_marker(engine, options.job, batch_id)
    finally:
        engine.dispose()
    outcome = BatchOutcome(
        job=options.job, batch_id=batch_id, status="replayed", run_id=None, original=original
    )
    return _log(outcome)


def _abandon_quietly(engine: Engine, run_id: str) -> None:
    with contextlib.suppress(OutboxError):
        runs.abandon(engine, run_id)


def _log(outcome: BatchOutcome) -> BatchOutcome:
    fields = dataclasses.asdict(outcome)
    log.info("batch %s", outcome.status, extra={"event": f"batch.{outcome.status}", **fields})
    return outcome
