"""The driver's one transaction that commits a staged batch (DESIGN.md, steps 3-4).

Marker first (the fence: a racing or zombie attempt finds the conflict and
rolls back), then results, rejects, effects and counts, then the attempt's
staging rows are deleted and dispatchers are notified, all in ONE COMMIT.
A COMMIT whose outcome is unknown (connection lost) is resolved by reading the
marker; only when the marker proves it did not commit is the transaction run
again, and the unique marker fences even that.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg2
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from dispatcher import db
from dispatcher.errors import OutboxError
from dispatcher.sqlfile import queries_beside
from spark_jobs import phases
from spark_jobs.results import ResultsSpec, apply_statement

log = logging.getLogger(__name__)
_Q = queries_beside(__file__, "commit.sql")


class BatchNotCommitted(OutboxError):
    """The batch was not committed; nothing of it is visible. Re-running it is safe."""


class InvalidRows(BatchNotCommitted):
    """on_invalid="fail" and some rows broke the contract."""


@dataclasses.dataclass(frozen=True)
class Staged:
    """What the executors staged for one attempt: the task attempts that succeeded."""

    attempt_id: str
    effect_tasks: tuple[int, ...] = ()
    result_tasks: tuple[int, ...] = ()
    effect_rows: int = 0
    result_rows: int = 0


@dataclasses.dataclass(frozen=True)
class BatchOutcome:
    job: str
    batch_id: str
    # committed: this attempt; replayed: a marker existed before we started;
    # lost_race: another attempt committed while we staged.
    status: str
    attempt_id: str
    result_rows: int = 0
    effects_total: int = 0
    effects_new: int = 0
    effects_deduplicated: int = 0
    payload_mismatches: int = 0
    rejects: int = 0
    resolved_by_marker: bool = False


def engine_for(url: str) -> Engine:
    """No pool: each phase gets a fresh connection, a lost one is never reused."""
    return sa.create_engine(
        db.sqlalchemy_url(url),
        poolclass=NullPool,
        connect_args={"application_name": "spark-outbox-commit"},
    )


def read_outcome(engine: Engine, job: str, batch_id: str, status: str) -> BatchOutcome | None:
    with engine.connect() as conn:
        row = conn.execute(_Q["read_marker"], {"job": job, "batch_id": batch_id}).mappings().first()
    if row is None:
        return None
    counts = {k: int(v) for k, v in row.items() if k != "attempt_id"}
    return BatchOutcome(job, batch_id, status, str(row["attempt_id"]), **counts)


def begin_attempt(engine: Engine, job: str, batch_id: str, grace_s: float) -> str:
    """Sweep abandoned attempts, then register a fresh one; return its id."""
    attempt_id = str(uuid.uuid4())
    with engine.begin() as conn:
        _sweep(conn, grace_s)
        conn.execute(
            _Q["begin_attempt"], {"attempt_id": attempt_id, "job": job, "batch_id": batch_id}
        )
    return attempt_id


def sweep(engine: Engine, grace_s: float) -> None:
    """Delete staging rows of attempts that can never commit (also run after each commit)."""
    with engine.begin() as conn:
        _sweep(conn, grace_s)


def _sweep(conn: Connection, grace_s: float) -> None:
    abandoned = [str(r[0]) for r in conn.execute(_Q["abandoned_attempts"], {"grace_s": grace_s})]
    if abandoned:
        drop_staging(conn, abandoned)
        log.info(
            "swept abandoned attempts", extra={"event": "batch.swept", "attempts": len(abandoned)}
        )


def drop_staging(conn: Connection, attempt_ids: Sequence[str]) -> None:
    params = {"attempt_ids": list(attempt_ids)}
    for name in ("delete_staged_effects", "delete_staged_results", "delete_attempts"):
        conn.execute(_Q[name], params)


@dataclasses.dataclass(frozen=True)
class CommitRequest:
    job: str
    batch_id: str
    results: ResultsSpec | None
    result_columns: tuple[str, ...]
    on_invalid: str  # "reject" | "fail"
    spark_app_id: str | None = None


def commit(
    engine: Engine,
    request: CommitRequest,
    staged: Staged,
    stage_in_tx: Callable[[Any], Staged] | None = None,
) -> BatchOutcome:
    """Commit the staged attempt; ``stage_in_tx`` (small-batch path) stages inside the tx."""
    for round_ in (1, 2):
        try:
            return _commit_once(engine, request, staged, stage_in_tx)
        except (sa.exc.DBAPIError, psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            if not _connection_lost(exc):
                raise
            log.warning(
                "commit outcome unknown, reading the marker",
                extra={"event": "batch.commit_unknown", "batch_id": request.batch_id},
            )
            outcome = read_outcome(engine, request.job, request.batch_id, "committed")
            if outcome is not None:
                won = outcome.attempt_id == staged.attempt_id
                return dataclasses.replace(
                    outcome, status="committed" if won else "lost_race", resolved_by_marker=True
                )
            if round_ == 2:
                raise BatchNotCommitted(
                    f"batch {request.batch_id!r}: connection lost twice before COMMIT; "
                    "nothing was committed, re-run the batch"
                ) from exc
    raise AssertionError("unreachable")


def _connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, sa.exc.DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(
            exc.orig, psycopg2.OperationalError | psycopg2.InterfaceError
        )
    return True


def _commit_once(
    engine: Engine,
    request: CommitRequest,
    staged: Staged,
    stage_in_tx: Callable[[Any], Staged] | None,
) -> BatchOutcome:
    started = time.monotonic()
    with engine.connect() as conn:
        inserted = conn.execute(
            _Q["insert_marker"],
            {
                "job": request.job,
                "batch_id": request.batch_id,
                "attempt_id": staged.attempt_id,
                "spark_app_id": request.spark_app_id,
            },
        ).first()
        if inserted is None:
            conn.rollback()
            return BatchOutcome(request.job, request.batch_id, "lost_race", staged.attempt_id)
        if stage_in_tx is not None:
            staged = stage_in_tx(conn.connection.dbapi_connection.cursor())
        counts = _merge(conn, request, staged)
        counts["duration_s"] = time.monotonic() - started
        conn.execute(
            _Q["finish_marker"], {"job": request.job, "batch_id": request.batch_id, **counts}
        )
        drop_staging(conn, [staged.attempt_id])
        conn.execute(_Q["notify_committed"], {"payload": f"{request.job}/{request.batch_id}"})
        phases.reached("before_commit")
        conn.commit()
        phases.reached("after_commit")
    counts.pop("duration_s")
    return BatchOutcome(request.job, request.batch_id, "committed", staged.attempt_id, **counts)


def _merge(conn: Connection, request: CommitRequest, staged: Staged) -> dict[str, Any]:
    found = conn.execute(
        _Q["count_staged"],
        {
            "attempt_id": staged.attempt_id,
            "task_ids": list(staged.effect_tasks + staged.result_tasks),
        },
    ).one()
    if (found.effects, found.results) != (staged.effect_rows, staged.result_rows):
        raise BatchNotCommitted(
            f"batch {request.batch_id!r}: found {found.effects}/{found.results} staged "
            f"effect/result rows, expected {staged.effect_rows}/{staged.result_rows} "
            "(swept as abandoned?); nothing was committed, re-run the batch"
        )
    fx = {
        "job": request.job,
        "batch_id": request.batch_id,
        "attempt_id": staged.attempt_id,
        "task_ids": list(staged.effect_tasks),
    }
    if request.on_invalid == "fail":
        reasons = [r[0] for r in conn.execute(_Q["first_reject_reasons"], {**fx, "limit": 5})]
        if reasons:
            raise InvalidRows(
                f"batch {request.batch_id!r}: invalid effect rows (on_invalid='fail'), first "
                "reasons: " + " | ".join(reasons)
            )
    result_rows = 0
    if request.results is not None and staged.result_rows:
        statement = apply_statement(conn, request.results, request.result_columns)
        params = {"attempt_id": staged.attempt_id, "task_ids": list(staged.result_tasks)}
        result_rows = conn.execute(statement, params).rowcount
    rejects = conn.execute(_Q["move_rejects"], fx).rowcount
    total, new = conn.execute(_Q["insert_effects"], fx).one()
    mismatches = conn.execute(_Q["count_payload_mismatches"], fx).scalar() if new < total else 0
    return {
        "result_rows": result_rows,
        "effects_total": int(total),
        "effects_new": int(new),
        "effects_deduplicated": int(total - new),
        "payload_mismatches": int(mismatches or 0),
        "rejects": int(rejects),
    }
