"""The sink behind a real PgBouncer in transaction pooling mode, and the bound on
its executors' connections: 200 partitions never write on more than
``max_connections`` connections."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.spark.sink import OutboxSink
from tests.conftest import insert_billing_endpoints, insert_endpoint
from tests.invariants import assert_invariants
from tests.pooler import PgBouncer, binary
from tests.spark.helpers import (
    EFFECT_SCHEMA,
    EFFECTS_SNAPSHOT,
    INVOICE_SCHEMA,
    INVOICES_SNAPSHOT,
    effect_rows,
    invoice_rows,
    sink,
    table,
)

pytestmark = pytest.mark.spark

MARKERS = (
    "SELECT job, batch_id, result_rows, effects_total, effects_new, effects_deduplicated, "
    "payload_mismatches, rejects FROM batches ORDER BY 1, 2"
)
REJECTS = "SELECT job, batch_id, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3, 4"
DATES = ("2026-01-01", "2026-01-02")


@pytest.fixture
def pooled(db_url: str) -> Iterator[str]:
    if binary() is None:
        pytest.skip("PgBouncer is fetched with apt-get download: needs Debian's apt-get")
    bouncer = PgBouncer(db_url, pool_mode="transaction", pool_size=3).start()
    try:
        yield bouncer.url(db_url)
    finally:
        bouncer.stop()


def _digest(engine: Engine) -> tuple[Any, ...]:
    queries = (INVOICES_SNAPSHOT, EFFECTS_SNAPSHOT, MARKERS, REJECTS)
    return tuple(table(engine, sql) for sql in queries)


def test_the_billing_job_through_transaction_pooling_equals_a_direct_run(
    spark: Any,
    pooled: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    tmp_path: Path,
) -> None:
    events = tmp_path / "events"
    generate(events, customers=8, events=120, seed=5, bad_rows=2, days=len(DATES))
    direct_url, direct = second_db
    for e in (engine, direct):
        insert_billing_endpoints(e)
    for date in DATES:
        billing_run.run_batch(spark, events, date, direct_url)
        billing_run.run_batch(spark, events, date, pooled)
        billing_run.run_batch(spark, events, date, pooled)  # a replay, through the pooler too
    assert _digest(engine) == _digest(direct)
    assert_invariants(engine)


def _tasks_of_group(spark: Any, group: str) -> list[int]:
    tracker = spark.sparkContext.statusTracker()
    tasks = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            stage_info = tracker.getStageInfo(stage)
            if stage_info is not None:
                tasks.append(stage_info.numTasks)
    return tasks


def test_two_hundred_partitions_write_on_at_most_max_connections_connections(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    effects = spark.createDataFrame(effect_rows(400), EFFECT_SCHEMA).repartition(200)
    results = spark.createDataFrame(invoice_rows(400), INVOICE_SCHEMA).repartition(200)
    spark.sparkContext.setJobGroup("bounded-write", "the sink's writes")
    try:
        outcome = sink(db_url, max_connections=3).write(results, effects, batch_id="b1")
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert outcome.status == "committed" and outcome.effects_new == 400
    # Each executor task holds one connection (spark_outbox.spark.executor): the
    # write stages ran 3 tasks each, not 200 (the shuffles' map sides, over the two
    # input slices, do not connect).
    tasks = _tasks_of_group(spark, "bounded-write")
    assert tasks and max(tasks) <= 3 and 3 in tasks, tasks
    assert_invariants(engine)


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, 10_001])
def test_a_bad_bound_is_a_clear_error(db_url: str, bound: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"max_connections=.*whole number from 1"):
        OutboxSink(job="t", database_url=db_url, max_connections=bound)
