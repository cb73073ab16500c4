"""The driver's ONE commit transaction of a batch (docs/design.md, the batch commit protocol).

By the time it opens, the executors have written the batch's effects straight
into ``effects`` (invisible: their run has no marker), staged its result rows
and rejects, and deferred the keys another markerless run held. The
transaction, step by step (each a function below, each statement in commit.sql):

1. claim the run (a swept run cannot commit);
2. insert the marker: the fence; a conflict means another run won: roll back;
3. check that every staged row the succeeded tasks reported is there;
4. refuse the batch if on_invalid="fail" and it has rejects;
5. merge the result rows into the user's table, recording each for the batch
   (reconciliation re-reads the table), the rows it refuses becoming rejects
   (spark_outbox.spark.result_rejects); move the effects' rejects;
6. take the visibility lock, then take over the deferred keys still held by a
   run without a marker; count new (per endpoint), deduplicated and mismatched effects;
7. the volume guard (spark_outbox.spark.guard): an outsized batch is held, its effects
   visible but not claimable until an operator releases it;
8. write the counts and the hold on the marker, drop the run's staging, NOTIFY, COMMIT.

The COMMIT makes the marker, and with it every effect row of the run, the
results and the rejects visible at once. A COMMIT whose outcome is unknown
(connection lost) is resolved by reading the marker; only when the marker
proves it did not commit is the transaction run again, fenced by the marker.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from sqlalchemy.engine import Connection, Engine

from spark_outbox.core import db, wakeup
from spark_outbox.core.auditlog import SYSTEM_ACTOR, record_action
from spark_outbox.core.errors import DatabaseUnavailable
from spark_outbox.core.schema import VISIBILITY_LOCK_ID
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.core.tracing import Carrier
from spark_outbox.spark import guard, notices, phases, result_rejects
from spark_outbox.spark.outcome import (
    BatchCounts,
    BatchInterrupted,
    BatchNotCommitted,
    BatchOutcome,
    InvalidRows,
)
from spark_outbox.spark.protocol import TaskReport
from spark_outbox.spark.result_rejects import Merged
from spark_outbox.spark.results import ResultsSpec
from spark_outbox.spark.runs import read_marker

log = logging.getLogger(__name__)
_Q = queries_beside(__file__, "commit.sql")


@dataclasses.dataclass(frozen=True)
class CommitRequest:
    job: str
    batch_id: str
    run_id: str
    results: ResultsSpec | None
    result_columns: tuple[str, ...]
    on_invalid: str  # "reject" | "fail"
    spark_app_id: str | None = None
    volume_guard: guard.VolumeGuard = dataclasses.field(default_factory=guard.VolumeGuard)
    # The batch's span (tracing on): kept on the marker; its effects' sends join it.
    trace: Carrier | None = None


@dataclasses.dataclass(frozen=True)
class Written:
    """What the Spark tasks that succeeded reported writing."""

    effect_tasks: tuple[TaskReport, ...] = ()
    result_tasks: tuple[TaskReport, ...] = ()

    def ids(self, kind: str) -> list[int]:
        tasks = self.effect_tasks if kind == "effects" else self.result_tasks
        return [t.task_id for t in tasks]

    def total(self, field: str, kind: str = "effects") -> int:
        tasks = self.effect_tasks if kind == "effects" else self.result_tasks
        return sum(int(getattr(t, field)) for t in tasks)


def commit(engine: Engine, request: CommitRequest, written: Written) -> BatchOutcome:
    for round_ in (1, 2):
        try:
            with db.translated():
                return _commit_once(engine, request, written)
        except DatabaseUnavailable as exc:
            outcome = _resolve_by_marker(engine, request)
            if outcome is not None:
                return outcome
            if round_ == 2:
                raise BatchInterrupted(
                    f"batch {request.batch_id!r}: connection lost twice before COMMIT; "
                    "nothing was committed, re-run the batch"
                ) from exc
    raise AssertionError("unreachable")


def _commit_once(engine: Engine, request: CommitRequest, written: Written) -> BatchOutcome:
    started = time.monotonic()
    with engine.connect() as conn:
        claim_run(conn, request)
        marker_id = insert_marker(conn, request)
        if marker_id is None:
            conn.rollback()
            return BatchOutcome(
                job=request.job,
                batch_id=request.batch_id,
                status="lost_race",
                run_id=request.run_id,
            )
        check_staged(conn, request, written)
        refuse_invalid(conn, request, written)
        merged = merge_results(conn, request, written, marker_id)
        rejects = move_rejects(conn, request, written) + merged.rejects
        conn.execute(_Q["take_visibility_lock"], {"lock_id": VISIBILITY_LOCK_ID})
        counts, by_endpoint, keys = resolve_effects(conn, request, written, merged.rows, rejects)
        held = hold_reason(conn, request, by_endpoint)
        finish(conn, request, counts, by_endpoint, held, time.monotonic() - started)
    notices.batch_committed(request.job, request.batch_id, held, counts.payload_mismatches, keys)
    return BatchOutcome(
        job=request.job,
        batch_id=request.batch_id,
        status="committed",
        run_id=request.run_id,
        held_reason=held,
        **dataclasses.asdict(counts),
    )


def claim_run(conn: Connection, request: CommitRequest) -> None:
    if conn.execute(_Q["claim_run"], {"run_id": request.run_id}).first() is None:
        raise BatchNotCommitted(
            f"batch {request.batch_id!r}: run {request.run_id} was swept as abandoned (older "
            "than the grace period, or its batch committed by another run); re-run the batch"
        )


def insert_marker(conn: Connection, request: CommitRequest) -> int | None:
    """The fence: the marker's id; None when another run holds the batch (it
    committed first). It names where the result rows go (reconciliation reads it)."""
    spec = request.results
    params = {
        "job": request.job,
        "batch_id": request.batch_id,
        "run_id": request.run_id,
        "spark_app_id": request.spark_app_id,
        "trace_parent": request.trace.traceparent if request.trace else None,
        "trace_state": request.trace.tracestate if request.trace else None,
        "results_table": spec.table if spec else None,
        "result_keys": list(spec.conflict_keys) if spec else None,
        "result_columns": list(request.result_columns) if spec else None,
        "result_stamp": list(spec.batch_columns) if spec and spec.batch_columns else None,
    }
    found = conn.execute(_Q["insert_marker"], params).first()
    return None if found is None else int(found[0])


def check_staged(conn: Connection, request: CommitRequest, written: Written) -> None:
    found = conn.execute(
        _Q["count_staged"],
        {
            "run_id": request.run_id,
            "effect_tasks": written.ids("effects"),
            "result_tasks": written.ids("results"),
        },
    ).one()
    expected = (
        written.total("rows", "results"),
        written.total("rejects"),
        written.total("deferred"),
    )
    if tuple(found) != expected:  # e.g. a crash emptied the UNLOGGED staging
        raise BatchInterrupted(
            f"batch {request.batch_id!r}: found {tuple(found)} staged result/reject/deferred "
            f"rows, the tasks reported {expected}; nothing was committed, re-run the batch"
        )


def refuse_invalid(conn: Connection, request: CommitRequest, written: Written) -> None:
    if request.on_invalid != "fail" or not written.total("rejects"):
        return
    params = {"run_id": request.run_id, "task_ids": written.ids("effects"), "limit": 5}
    reasons = [r[0] for r in conn.execute(_Q["first_reject_reasons"], params)]
    raise InvalidRows(
        f"batch {request.batch_id!r}: invalid effect rows (on_invalid='fail'), first "
        "reasons: " + " | ".join(reasons)
    )


def merge_results(
    conn: Connection, request: CommitRequest, written: Written, marker_id: int
) -> Merged:
    """Result rows into the user's table, each recorded for the batch; rows it
    refuses become rejects (spark_outbox.spark.result_rejects), or end the batch
    with on_invalid="fail"."""
    if request.results is None or not written.total("rows", "results"):
        return Merged()
    return result_rejects.merge(conn, request, written.ids("results"), batch_ref=marker_id)


def move_rejects(conn: Connection, request: CommitRequest, written: Written) -> int:
    if not written.total("rejects"):
        return 0
    params = {
        "job": request.job,
        "batch_id": request.batch_id,
        "run_id": request.run_id,
        "task_ids": written.ids("effects"),
    }
    return int(conn.execute(_Q["move_rejects"], params).rowcount)


def resolve_effects(
    conn: Connection, request: CommitRequest, written: Written, result_rows: int, rejects: int
) -> tuple[BatchCounts, dict[str, int], list[str]]:
    """Under the visibility lock: deferred keys taken over or deduplicated; the counts,
    the new effects per endpoint (for the volume guard) and a few mismatched keys."""
    params = {
        "job": request.job,
        "batch_id": request.batch_id,
        "run_id": request.run_id,
        "task_ids": written.ids("effects"),
    }
    mismatches = written.total("mismatches")
    keys = [k for t in written.effect_tasks for k in t.mismatch_keys]
    if written.total("deferred"):
        conn.execute(_Q["take_over_deferred"], params)
        deferred, deferred_keys = conn.execute(_Q["count_deferred_mismatches"], params).one()
        mismatches += int(deferred)
        keys += deferred_keys or []
    total = written.total("rows")
    by_endpoint = {str(e): int(n) for e, n in conn.execute(_Q["count_own_effects"], params)}
    new = sum(by_endpoint.values())
    counts = BatchCounts(
        result_rows=result_rows,
        effects_total=total,
        effects_new=new,
        effects_deduplicated=max(total - new, 0),
        payload_mismatches=mismatches,
        rejects=rejects,
    )
    return counts, by_endpoint, keys


def hold_reason(
    conn: Connection, request: CommitRequest, by_endpoint: dict[str, int]
) -> str | None:
    """The volume guard's verdict: why the batch is held, or None."""
    found = guard.baselines(conn, request.job, request.volume_guard, sorted(by_endpoint))
    return guard.hold_reason(request.volume_guard, by_endpoint, found)


def finish(
    conn: Connection,
    request: CommitRequest,
    counts: BatchCounts,
    by_endpoint: dict[str, int],
    held: str | None,
    duration_s: float,
) -> None:
    """Counts and hold on the marker, staging dropped, dispatchers notified: the COMMIT.
    A hold is the system's decision: audited as an operator's release of it is."""
    if held is not None:
        params = {"job": request.job, "batch_id": request.batch_id, "run_id": request.run_id}
        conn.execute(_Q["hold_effects"], params)
        record_action(
            conn,
            actor=SYSTEM_ACTOR,
            action="hold_batch",
            target=f"{request.job}/{request.batch_id}",
            reason=held,
            details={"run_id": str(request.run_id), "new_effects_by_endpoint": by_endpoint},
        )
    conn.execute(
        _Q["finish_marker"],
        {
            "job": request.job,
            "batch_id": request.batch_id,
            "duration_s": duration_s,
            "by_endpoint": json.dumps(by_endpoint),
            "hold_state": None if held is None else "held",
            "hold_reason": held,
            **dataclasses.asdict(counts),
        },
    )
    conn.execute(_Q["delete_staging"], {"run_ids": [request.run_id]})
    wakeup.notify(conn, f"{request.job}/{request.batch_id}")
    phases.reached("before_commit")
    conn.commit()
    phases.reached("after_commit")


def _resolve_by_marker(engine: Engine, request: CommitRequest) -> BatchOutcome | None:
    """After a lost connection: the marker says who committed; None means nobody did."""
    log.warning(
        "commit outcome unknown, reading the marker",
        extra={"event": "batch.commit_unknown", "batch_id": request.batch_id},
    )
    marker = read_marker(engine, request.job, request.batch_id)
    if marker is None:
        return None
    won = marker.run_id == request.run_id
    counts = {f.name: getattr(marker, f.name) for f in dataclasses.fields(BatchCounts)}
    return BatchOutcome(
        job=request.job,
        batch_id=request.batch_id,
        status="committed" if won else "lost_race",
        run_id=request.run_id,
        resolved_by_marker=True,
        held_reason=marker.hold_reason if won else None,
        **(counts if won else {}),
    )
