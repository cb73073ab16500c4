"""The pipelined commit against real PostgreSQL, with staging driven by hand.

Spark is left out on purpose: these tests play the executors (``stage`` with
chunk commits, exactly what ``stage_partition`` runs) so they can stage chunks
of a task attempt that Spark would later call failed, which local Spark does
not do on demand.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import psycopg2
import pyarrow as pa
import pytest
from sqlalchemy.engine import Engine

from dispatcher import db
from dispatcher.enqueue import enqueue
from dispatcher.keys import effect_key
from spark_jobs import commit as store
from spark_jobs.executor import stage
from tests.conftest import insert_endpoint
from tests.spark.helpers import EFFECT_ARROW_SCHEMA, table


def _batch(first: int, n: int) -> pa.RecordBatch:
    rows = [
        {
            "idempotency_key": effect_key("pipe", i),
            "endpoint": "hook" if i % 10 else "nope",  # every tenth row: a reject
            "payload": json.dumps({"i": i}),
            "recipient": None,
            "ordering_key": None,
            "reject_reason": None,
            "not_before": None,
        }
        for i in range(first, first + n)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=EFFECT_ARROW_SCHEMA)


def _stage_task(db_url: str, run_id: str, task_id: int, batches: list[pa.RecordBatch]) -> int:
    """One executor task: chunks of 10 rows, each committed on its own."""
    conn = psycopg2.connect(db.libpq_url(db_url))
    try:
        with conn, conn.cursor() as cur:
            return stage(cur, "effects", batches, run_id, task_id, chunk_rows=10)
    finally:
        conn.close()


def _request() -> store.CommitRequest:
    return store.CommitRequest("t", "b1", None, (), "reject")


def _commit(engine: Engine, db_url: str, run: Callable[[str], store.Staged]) -> store.BatchOutcome:
    commit_engine = store.engine_for(db_url)
    try:
        run_id = store.begin_run(commit_engine, "t", "b1", 3600)
        return store.commit_pipelined(commit_engine, _request(), run_id, lambda: run(run_id))
    finally:
        commit_engine.dispose()


def _merging_into_effects(engine: Engine) -> bool:
    """True once the open commit transaction has inserted into effects."""
    rows = table(
        engine,
        "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        "WHERE c.relname = 'effects' AND l.mode = 'RowExclusiveLock' AND l.granted",
    )
    return bool(rows)


def test_chunks_are_merged_while_staging_goes_on(db_url: str, engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    overlapped = []

    def run(run_id: str) -> store.Staged:
        first = _stage_task(db_url, run_id, 1, [_batch(0, 10), _batch(10, 10)])
        deadline = time.monotonic() + 10
        while not _merging_into_effects(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        overlapped.append(_merging_into_effects(engine))  # task 2 has not staged yet
        second = _stage_task(db_url, run_id, 2, [_batch(20, 15)])
        return store.Staged(run_id, (1, 2), (), first + second, 0)

    outcome = _commit(engine, db_url, run)
    assert overlapped == [True]
    assert (outcome.status, outcome.effects_total, outcome.effects_new, outcome.rejects) == (
        "committed",
        31,
        31,
        4,
    )
    assert table(engine, "SELECT count(*) FROM effects")[0][0] == 31
    assert table(engine, "SELECT count(*) FROM rejects")[0][0] == 4
    for staging in ("staged_effects", "staged_chunks", "batch_runs"):
        assert table(engine, f"SELECT count(*) FROM {staging}")[0][0] == 0


def test_a_merged_chunk_of_a_failed_task_attempt_makes_the_commit_start_over(
    db_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    insert_endpoint(engine, "hook")

    def run(run_id: str) -> store.Staged:
        # Task attempt 7 staged a chunk of rows 0-9 and then failed; Spark ran the
        # partition again as task attempt 8 (rows 0-19). Only 8 and 9 succeeded.
        _stage_task(db_url, run_id, 7, [_batch(0, 10), _batch(100, 10)])
        deadline = time.monotonic() + 10
        while not _merging_into_effects(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = _stage_task(db_url, run_id, 8, [_batch(0, 20)])
        rows += _stage_task(db_url, run_id, 9, [_batch(20, 5)])
        return store.Staged(run_id, (8, 9), (), rows, 0)

    with caplog.at_level(logging.WARNING, logger="spark_jobs.commit"):
        outcome = _commit(engine, db_url, run)
    assert [r.event for r in caplog.records] == ["batch.remerge"]  # type: ignore[attr-defined]
    assert (outcome.status, outcome.effects_new, outcome.effects_deduplicated) == (
        "committed",
        22,
        0,
    )
    keys = {r[0] for r in table(engine, "SELECT idempotency_key FROM effects")}
    assert keys == {effect_key("pipe", i) for i in range(25) if i % 10}
    assert table(engine, "SELECT count(*) FROM rejects")[0][0] == 3
    assert table(engine, "SELECT effects_new, rejects FROM batches")[0] == (22, 3)


def test_taken_keys_in_a_later_chunk_are_deduplicated_and_counted(
    db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    enqueue_engine = db.create_engine(db_url)
    try:
        with enqueue_engine.begin() as conn:
            enqueue(
                conn, idempotency_key=effect_key("pipe", 25), endpoint="hook", payload={"i": 25}
            )
            enqueue(
                conn,
                idempotency_key=effect_key("pipe", 26),
                endpoint="hook",
                payload={"i": "other"},
            )
    finally:
        enqueue_engine.dispose()

    def run(run_id: str) -> store.Staged:
        # two chunks: keys 1-10, then 21-30 (10 and 30 name an unknown endpoint)
        rows = _stage_task(db_url, run_id, 1, [_batch(1, 10), _batch(21, 10)])
        return store.Staged(run_id, (1,), (), rows, 0)

    outcome = _commit(engine, db_url, run)
    assert (
        outcome.effects_total,
        outcome.effects_new,
        outcome.effects_deduplicated,
        outcome.payload_mismatches,
    ) == (18, 16, 2, 1)
    assert outcome.rejects == 2
    assert table(engine, "SELECT count(*) FROM effects")[0][0] == 18
