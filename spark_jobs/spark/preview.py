"""Preview a batch: what ``write`` would enqueue, computed in full, written nowhere.

The executors check every row exactly as the write does and compare the keys
with what is stored, on read-only connections (spark_outbox.spark.preview_tasks); the
driver reads the marker and the volume guard's baselines, also read-only. No
run is registered, no row is written, no marker is made: PostgreSQL itself
refuses a write on these connections. A batch id that committed before is
previewed all the same (``committed_before``): the payloads are computed, so a
re-run shows what changed.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from spark_outbox.core import db
from spark_outbox.spark import guard, runs
from spark_outbox.spark.contract import effect_frame
from spark_outbox.spark.preview_tasks import preview_writer
from spark_outbox.spark.protocol import REPORT_SCHEMA, TaskReport

REASONS_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class BatchPreview:
    job: str
    batch_id: str
    committed_before: bool  # the batch id has a marker: a write would be a replay
    result_rows: int
    effects_total: int  # valid effect rows
    effects_new: int  # keys nothing stored holds: a write would enqueue them
    new_by_endpoint: dict[str, int]
    same_payload: dict[str, int]  # stored keys with the same payload, by their state
    different_payload: dict[str, int]  # stored keys with another payload, by state
    examples: list[dict[str, Any]]  # a few of those, the differing fields truncated
    rejects: int
    reject_reasons: dict[str, int]  # the most common reasons
    would_hold: str | None  # the volume guard's verdict (None: it would flow)


def preview(
    job: str,
    database_url: str,
    volume_guard: guard.VolumeGuard,
    results_df: Any,
    effects_df: Any,
    batch_id: str,
    *,
    max_connections: int,
) -> BatchPreview:
    engine = runs.engine_for(database_url)
    try:
        committed_before = runs.read_marker(engine, job, batch_id) is not None
        endpoints = runs.endpoint_kinds(engine)
        total = _run_tasks(db.libpq_url(database_url), endpoints, effects_df, max_connections)
        new_by_endpoint = dict(total.new_by_endpoint)
        with db.translated(), engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            found = guard.baselines(conn, job, volume_guard, sorted(new_by_endpoint))
            conn.rollback()
    finally:
        engine.dispose()
    return BatchPreview(
        job=job,
        batch_id=batch_id,
        committed_before=committed_before,
        result_rows=results_df.count() if results_df is not None else 0,
        effects_total=total.rows,
        effects_new=sum(new_by_endpoint.values()),
        new_by_endpoint=new_by_endpoint,
        same_payload=dict(total.same_by_state),
        different_payload=dict(total.different_by_state),
        examples=[dict(example) for example in total.examples],
        rejects=total.rejects,
        reject_reasons=dict(Counter(total.reject_reasons).most_common(REASONS_SHOWN)),
        would_hold=guard.hold_reason(volume_guard, new_by_endpoint, found),
    )


def _run_tasks(
    dsn: str, endpoints: dict[str, str], effects_df: Any, max_connections: int
) -> TaskReport:
    """Twins of a key in one partition, at most ``max_connections`` tasks (each holds a
    connection); the reports added up. The partitions are Spark's shuffle partitions,
    which its adaptive execution merges when small: no ``rdd`` (Spark Connect has none)."""
    frame = effect_frame(effects_df).repartition("idempotency_key").coalesce(max_connections)
    rows = frame.mapInArrow(preview_writer(dsn, endpoints), REPORT_SCHEMA).collect()
    return sum((TaskReport.from_row(row) for row in rows), TaskReport())
