"""PostgreSQL crashed (``pg_ctl restart -m immediate``) during a sink commit: the
sink resumes by itself, and nothing is lost or doubled.

A crash loses the commit's open transaction and empties every UNLOGGED table
(the staged results, rejects and deferred keys); the effects the executors wrote
survive, invisible. The sink reads the marker (none: nothing committed), waits for
the database and writes the batch again as a new run, which takes the dead run's
keys over; a stream goes on to its next micro-batch. Runs on its OWN private
cluster (never the shared one the other tests use).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db
from spark_outbox.spark import phases
from tests.conftest import insert_endpoint
from tests.invariants import assert_invariants
from tests.spark.helpers import (
    EFFECT_SCHEMA,
    INVOICE_SCHEMA,
    effect_rows,
    invoice_rows,
    numbers_query,
    run_state,
    sink,
    table,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    cluster = PrivateCluster(tmp_path_factory.mktemp("pg-crash") / "state")
    yield cluster
    cluster.stop()
    subprocess.run(["rm", "-rf", str(cluster.state_dir)], check=False)


@pytest.fixture
def two_databases(own_cluster: PrivateCluster) -> Iterator[tuple[str, str]]:
    """The crashed run's database and a clean run's, with endpoint ``hook``."""
    server = own_cluster.ensure_running().url
    template = scratch.ensure_template(server)
    urls = (scratch.clone_template(server, template), scratch.clone_template(server, template))
    for url in urls:
        engine = db.create_engine(url)
        insert_endpoint(engine, "hook")
        engine.dispose()
    yield urls


def _crash_once(cluster: PrivateCluster) -> tuple[Callable[[], None], list[int]]:
    """A hook that crashes PostgreSQL (and waits for its recovery) the first time it runs."""
    crashes: list[int] = []

    def crash() -> None:
        if crashes:
            return
        crashes.append(1)
        info = cluster.ensure_running()
        pg_ctl = [str(info.bin_dir / "pg_ctl"), "-D", str(cluster.data_dir)]
        cluster._run([*pg_ctl, "-l", str(cluster.log_file), "-m", "immediate", "-w", "restart"])

    return crash, crashes


def test_postgres_crashing_during_a_batch_commit_is_ridden_out_with_nothing_lost_or_doubled(
    spark: Any,
    own_cluster: PrivateCluster,
    two_databases: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    crashed_url, clean_url = two_databases
    results = spark.createDataFrame(invoice_rows(20), INVOICE_SCHEMA)
    bad = [("not-a-key", "hook", "{}", None)]
    effects = spark.createDataFrame([*effect_rows(40), *bad], EFFECT_SCHEMA)
    sink(clean_url).write(results, effects, batch_id="b1")

    crash, crashes = _crash_once(own_cluster)
    remove = phases.on("before_commit", crash)
    try:
        with caplog.at_level(logging.WARNING, logger="spark_outbox.spark"):
            outcome = sink(crashed_url).write(results, effects, batch_id="b1")
    finally:
        remove()
    assert crashes == [1]
    assert "batch.interrupted" in [getattr(r, "event", None) for r in caplog.records]
    assert (outcome.status, outcome.effects_new, outcome.result_rows) == ("committed", 40, 20)
    crashed, clean = db.create_engine(crashed_url), db.create_engine(clean_url)
    try:
        assert run_state(crashed) == run_state(clean)
        assert table(crashed, "SELECT count(*) FROM batches")[0][0] == 1
        assert table(crashed, "SELECT count(*) FROM effects")[0][0] == 40  # the dead run's swept
        assert_invariants(crashed)
    finally:
        crashed.dispose()
        clean.dispose()


def test_postgres_crashing_during_a_micro_batch_commit_does_not_stop_the_stream(
    spark: Any, own_cluster: PrivateCluster, two_databases: tuple[str, str], tmp_path: Path
) -> None:
    crashed_url, clean_url = two_databases
    source = tmp_path / "source"
    source.mkdir()
    for n in range(3):  # one file per micro-batch
        lines = [f'{{"n": {n * 10 + i}, "v": 1}}' for i in range(10)]
        (source / f"{n}.json").write_text("\n".join(lines) + "\n")
    clean_query = numbers_query(spark, source, tmp_path / "clean-cp", sink(clean_url, results=None))
    clean_query.awaitTermination()

    crash, crashes = _crash_once(own_cluster)
    remove = phases.on("before_commit", crash)
    try:
        query = numbers_query(spark, source, tmp_path / "cp", sink(crashed_url, results=None))
        query.awaitTermination()  # raises if a micro-batch failed
    finally:
        remove()
    assert crashes == [1] and query.exception() is None
    crashed, clean = db.create_engine(crashed_url), db.create_engine(clean_url)
    try:
        assert run_state(crashed, stream=True) == run_state(clean, stream=True)
        assert table(crashed, "SELECT count(*) FROM batches")[0][0] == 3
        assert_invariants(crashed)
    finally:
        crashed.dispose()
        clean.dispose()
