"""The hard cases of "visibility, not placement": real Spark, real PostgreSQL.

A *dead run* here is a run whose executors wrote its effects into the outbox
and whose driver never committed (it died): exactly what a driver killed
between the executors' write and the marker leaves behind. The trap: a key
first written by such a run must not swallow the same key of another batch
that does commit, in either order or concurrently; it must be delivered
exactly once (the dispatcher's real claim sees it once), and the dead run's
rows are swept without taking the key with them.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.bulk import load
from spark_outbox.core import db
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.dispatch import store
from spark_outbox.spark import commit, runs
from spark_outbox.spark.protocol import RunTag
from spark_outbox.spark.sink import OutboxSink
from tests.conftest import insert_endpoint
from tests.spark.helpers import EFFECT_SCHEMA, effect_rows, sink, table

pytestmark = pytest.mark.spark
SHARED = effect_rows(40)  # the keys both batches carry
DEAD_RUN = "00000000-0000-0000-0000-00000000dead"
VISIBLE_KEYS = "SELECT idempotency_key, batch_id FROM visible_effects ORDER BY 1"


@pytest.fixture
def hook(engine: Engine) -> Engine:
    insert_endpoint(engine, "hook")
    return engine


def _effects(spark: Any, rows: list[Any]) -> Any:
    return spark.createDataFrame(rows, EFFECT_SCHEMA).repartition(2)


def write_without_commit(
    target: OutboxSink, effects: Any, batch_id: str
) -> tuple[commit.CommitRequest, commit.Written]:
    """What a driver killed after its executors wrote leaves: a run, its rows, no marker.

    Returns the commit it did not make, for a test that makes it later."""
    engine = runs.engine_for(target.database_url)
    try:
        run_id = runs.begin_run(engine, target.job, batch_id)
        endpoints = runs.endpoint_kinds(engine)
    finally:
        engine.dispose()
    tag = RunTag(db.libpq_url(target.database_url), target.job, batch_id, run_id, endpoints)
    written = target._write_on_executors(tag, None, effects)
    return commit.CommitRequest(target.job, batch_id, run_id, None, (), "reject"), written


def _sweep_dead_runs(db_url: str) -> int:
    engine = runs.engine_for(db_url)
    try:
        with engine.begin() as conn:  # the dead run outlived the grace period
            conn.execute(sa.text("UPDATE batch_runs SET started_at = now() - interval '2 hours'"))
        return runs.sweep(engine, grace_s=3600)
    finally:
        engine.dispose()


def _claimed_once(engine: Engine) -> list[str]:
    """Every claimable key, by the dispatcher's own claim: each at most once."""
    keys = [c.idempotency_key for c in store.claim(engine, "w1", 1000, 30)]
    assert len(keys) == len(set(keys))
    assert store.claim(engine, "w2", 1000, 30) == []
    return sorted(keys)


def test_dead_run_first_the_committing_batch_takes_its_keys_over(
    spark: Any, db_url: str, hook: Engine
) -> None:
    live = sink(db_url, results=None, chunk_rows=7)
    write_without_commit(live, _effects(spark, SHARED), "dead")
    assert table(hook, "SELECT count(*) FROM visible_effects")[0][0] == 0
    outcome = live.write(None, _effects(spark, [*SHARED, *effect_rows(50)[40:]]), batch_id="live")
    assert (outcome.effects_total, outcome.effects_new, outcome.effects_deduplicated) == (50, 50, 0)
    assert {b for _, b in table(hook, VISIBLE_KEYS)} == {"live"}
    assert _sweep_dead_runs(db_url) == 0  # nothing of the dead run is left to delete
    assert _claimed_once(hook) == sorted(r[0] for r in effect_rows(50))


def test_dead_run_second_finds_the_keys_visible_and_its_sweep_takes_nothing(
    spark: Any, db_url: str, hook: Engine
) -> None:
    live = sink(db_url, results=None)
    live.write(None, _effects(spark, SHARED), batch_id="live")
    write_without_commit(live, _effects(spark, [*SHARED, *effect_rows(45)[40:]]), "dead")
    assert _sweep_dead_runs(db_url) == 5  # only its own 5 new keys
    assert {b for _, b in table(hook, VISIBLE_KEYS)} == {"live"}
    assert _claimed_once(hook) == sorted(r[0] for r in SHARED)


def test_dead_and_committing_runs_writing_the_same_keys_at_once_lose_no_key(
    spark: Any, db_url: str, hook: Engine
) -> None:
    rows = effect_rows(600)
    live = sink(db_url, results=None, chunk_rows=25)
    dead = threading.Thread(
        target=write_without_commit, args=(live, _effects(spark, rows[::-1]), "dead")
    )
    dead.start()
    outcome = live.write(None, _effects(spark, rows), batch_id="live")
    dead.join(timeout=300)
    assert outcome.effects_new == 600
    _sweep_dead_runs(db_url)
    assert len(table(hook, VISIBLE_KEYS)) == 600
    assert table(hook, "SELECT count(*) FROM effects")[0][0] == 600
    assert len(_claimed_once(hook)) == 600


@pytest.mark.parametrize("first", ["taker", "owner"])
def test_two_batches_writing_the_same_keys_then_committing_count_each_key_new_once(
    spark: Any, db_url: str, hook: Engine, first: str
) -> None:
    """B writes first and A finds B's rows invisible (deferred). Whichever commits
    first gets the keys (A takes them over, or B's own become visible); the other
    finds them visible and deduplicates. No key is lost or doubled."""
    b = write_without_commit(sink(db_url, results=None, job="b"), _effects(spark, SHARED), "1")
    a = write_without_commit(sink(db_url, results=None, job="a"), _effects(spark, SHARED), "1")
    assert a[1].total("deferred") == 40
    order = [a, b] if first == "taker" else [b, a]
    engine = runs.engine_for(db_url)
    try:
        outcomes = [commit.commit(engine, *made) for made in order]
    finally:
        engine.dispose()
    news = [(o.effects_new, o.effects_deduplicated) for o in outcomes]
    assert news == [(40, 0), (0, 40)]
    assert {b for _, b in table(hook, VISIBLE_KEYS)} == {"1"}
    assert _claimed_once(hook) == sorted(r[0] for r in SHARED)


def test_enqueue_takes_over_a_key_held_by_a_dead_run(spark: Any, db_url: str, hook: Engine) -> None:
    key = SHARED[0][0]
    write_without_commit(sink(db_url, results=None), _effects(spark, SHARED[:1]), "dead")
    with hook.begin() as conn:
        done = enqueue(conn, idempotency_key=key, endpoint="hook", payload={"from": "app"})
    assert (done.new, done.payload_mismatch) == (True, False)
    _sweep_dead_runs(db_url)
    assert table(hook, "SELECT job, payload->>'from' FROM visible_effects") == [(None, "app")]
    assert _claimed_once(hook) == [key]


def test_never_committed_rows_are_swept_in_small_batches_through_the_batch_index(
    spark: Any, db_url: str, hook: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = sink(db_url, results=None)
    live.write(None, _effects(spark, effect_rows(5, endpoint="hook")), batch_id="keep")
    write_without_commit(live, _effects(spark, effect_rows(60)[5:]), "dead")
    monkeypatch.setattr(runs, "SWEEP_BATCH_ROWS", 10)
    assert _sweep_dead_runs(db_url) == 55
    assert table(hook, "SELECT batch_id, count(*) FROM effects GROUP BY 1") == [("keep", 5)]
    assert table(hook, "SELECT count(*) FROM batch_runs")[0][0] == 0
    with hook.begin() as conn:  # a realistic table, so that the plan means something
        load(conn, effects=5_000, attempts=0)
        conn.execute(sa.text("ANALYZE"))
        sweep_sql = queries_beside(runs.__file__, "commit.sql")["delete_run_effects"].text
        plan = conn.execute(
            sa.text("EXPLAIN " + sweep_sql),
            {"job": "billing", "batch_id": "b-3", "run_id": DEAD_RUN, "limit": 10},
        ).all()
    text = "\n".join(r[0] for r in plan)
    assert "ix_effects_job_batch_id_created_at_id" in text, text
    assert "Seq Scan on effects" not in text, text
