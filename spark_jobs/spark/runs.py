"""Around the commit: the replay check, the endpoint kinds, a run's registration, the sweep.

A *run* is one try of the sink at a batch (docs/design.md). It is registered in
``batch_runs`` before its executors write anything, so that its rows can be
found and swept if it never commits: because another run committed its batch,
or because it is older than the grace period. The sweeper first sets
``swept_at`` (which fences the run's commit, see commit.sql ``claim_run``), then
deletes the run's effect rows in small batches through the batch's index, its
deferred and staged rows, and last its ``batch_runs`` row; a sweeper that dies
halfway is finished by the next one.
"""

from __future__ import annotations

import logging
import time
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from spark_outbox.core import db, revisions
from spark_outbox.core.errors import DatabaseUnavailable
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.spark.outcome import Marker

log = logging.getLogger(__name__)
_Q = queries_beside(__file__, "commit.sql")
SWEEP_BATCH_ROWS = 5_000
# Databases whose schema this process found usable (their SQLAlchemy URLs).
_USABLE: set[str] = set()


def engine_for(url: str) -> Engine:
    """No pool: each phase gets a fresh connection, a lost one is never reused.

    The first engine for a database in this process checks that its schema is this
    release's or later: every write starts here, on the driver, before any executor
    writes."""
    engine = sa.create_engine(
        db.sqlalchemy_url(url),
        poolclass=NullPool,
        # Errors never carry bound values (payloads), as spark_outbox.core.db's engines.
        hide_parameters=True,
        connect_args={"application_name": "spark-outbox-commit"},
    )
    engine = db.terse_errors(engine)
    key = db.sqlalchemy_url(url)
    if key not in _USABLE:  # a schema only moves forward: once per database and process
        try:
            revisions.require_usable(engine, "the Spark sink")
        except BaseException:
            engine.dispose()
            raise
        _USABLE.add(key)
    return engine


def require_schema(url: str) -> None:
    """Refuse an older schema now (spark_outbox.core.revisions), before tasks write."""
    engine_for(url).dispose()


def read_marker(engine: Engine, job: str, batch_id: str) -> Marker | None:
    with db.translated(), engine.connect() as conn:
        row = conn.execute(_Q["read_marker"], {"job": job, "batch_id": batch_id}).mappings().first()
    if row is None:
        return None
    counts = {k: int(v) for k, v in row.items() if k not in ("run_id", "hold_reason")}
    return Marker(run_id=str(row["run_id"]), hold_reason=row["hold_reason"], **counts)


def endpoint_kinds(engine: Engine) -> dict[str, str]:
    with db.translated(), engine.connect() as conn:
        return {str(name): str(kind) for name, kind in conn.execute(_Q["endpoint_kinds"])}


def begin_run(engine: Engine, job: str, batch_id: str) -> str:
    run_id = str(uuid.uuid4())
    with db.translated(), engine.begin() as conn:
        conn.execute(_Q["begin_run"], {"run_id": run_id, "job": job, "batch_id": batch_id})
    return run_id


def wait_for_database(url: str, outage_s: float) -> None:
    """Back once a connection answers again; ``DatabaseUnavailable`` after ``outage_s``."""
    deadline = time.monotonic() + outage_s
    pause_s = 0.1
    engine = engine_for(url)
    try:
        while True:
            try:
                with db.translated(), engine.connect() as conn:
                    conn.execute(_Q["database_answers"])
                return
            except DatabaseUnavailable:
                if time.monotonic() + pause_s > deadline:
                    raise
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 2.0)
    finally:
        engine.dispose()


def abandon(engine: Engine, run_id: str) -> None:
    """A run that will not commit (it failed): sweep its rows now."""
    with db.translated(), engine.begin() as conn:
        conn.execute(_Q["mark_swept"], {"run_id": run_id})
    sweep(engine, grace_s=None)


def sweep(engine: Engine, grace_s: float | None) -> int:
    """Sweep every run that can never commit; returns the effect rows deleted."""
    deleted = 0
    with db.translated():
        if grace_s is not None:
            with engine.begin() as conn:
                conn.execute(_Q["runs_to_sweep"], {"grace_s": grace_s})
        with engine.connect() as conn:
            runs = conn.execute(_Q["swept_runs"], {"limit": 100}).mappings().all()
        for run in runs:
            deleted += _sweep_run(engine, dict(run))
    if runs:
        log.info("swept runs", extra={"event": "batch.swept", "runs": len(runs), "rows": deleted})
    return deleted


def _sweep_run(engine: Engine, run: dict[str, object]) -> int:
    params = {**run, "run_id": str(run["run_id"]), "limit": SWEEP_BATCH_ROWS}
    deleted = 0
    while True:
        with engine.begin() as conn:
            rows = conn.execute(_Q["delete_run_effects"], params).rowcount
        deleted += rows
        if rows < SWEEP_BATCH_ROWS:
            break
    with engine.begin() as conn:
        conn.execute(_Q["delete_staging"], {"run_ids": [params["run_id"]]})
        conn.execute(_Q["delete_run"], params)
    return deleted
