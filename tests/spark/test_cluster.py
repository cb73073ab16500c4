"""The billing job on a real Spark standalone cluster (a master and two workers on
loopback, started from the installed PySpark, shared by the cluster tests), with
one executor JVM killed in the middle of a batch's effects write: Spark re-runs the
lost tasks and the database ends identical to one clean run (results, effect keys and payload
hashes, markers, rejects). The streaming job too, with its driver also killed
between two micro-batches and restarted from its checkpoint. And a Spark Connect
server whose master is the cluster. Every test on the shared cluster lives in this
file, so `make test`'s processes start it once (one file runs in one process).

The executors' Python is a venv without this package (``executor_python``), as
on a cluster whose workers never installed it: they run the zip the driver
ships (``outbox spark run`` does, spark_outbox.spark.shipping), and say so."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from spark_outbox.spark import shipping
from tests.conftest import insert_billing_endpoints
from tests.invariants import assert_invariants
from tests.spark.helpers import EFFECTS_SNAPSHOT, INVOICES_SNAPSHOT, run_state, table
from tests.spark.killing import Driver, billing_command, executor_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DATES = ("2026-01-01",)  # one day: a batch of 4 effect tasks on 2 one-core executors
MARKERS = (
    "SELECT job, batch_id, result_rows, effects_total, effects_new, effects_deduplicated, "
    "payload_mismatches, rejects FROM batches ORDER BY 1, 2"
)
REJECTS = "SELECT job, batch_id, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3, 4"
INVISIBLE = (
    "SELECT count(*) FROM effects e "
    "WHERE NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.id = e.id)"
)
LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)


def _digest(engine: Engine) -> tuple[Any, ...]:
    return tuple(
        table(engine, sql) for sql in (INVOICES_SNAPSHOT, EFFECTS_SNAPSHOT, MARKERS, REJECTS)
    )


@pytest.mark.timeout(900)
def test_executor_jvm_killed_mid_write_on_a_standalone_cluster_equals_a_clean_run(
    spark: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    tmp_path: Path,
    executor_python: Path,
    cluster: Any,
) -> None:
    events = tmp_path / "events"
    generate(events, customers=12, events=300, seed=21, bad_rows=3, days=len(DATES))
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_billing_endpoints(e)
    for date in DATES:  # the clean run, in local mode: the outcome must not depend on where
        billing_run.run_batch(spark, events, date, clean_url)

    # Every executor's task pauses 3 s after its first chunk of effects is in the
    # outbox (invisible), so the kill lands mid-write by construction. No PYTHONPATH
    # reaches the executors (the cluster's): this repository is not on their path.
    pause = executor_env(OUTBOX_SPARK_PHASES="effects_written:3")
    before = cluster.apps()
    args = ["--mode", "batch", "--input", str(events), "--master", cluster.master_url]
    command = billing_command(*args, *(a for d in DATES for a in ("--date", d)))
    driver = Driver(command, db_url, env={**pause, "PYSPARK_PYTHON": str(executor_python)})
    assert driver.wait_for("writing", timeout_s=300)
    invisible = _wait_for_invisible_rows(engine, driver)
    victims = cluster.executor_pids()
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)
    out = driver.finish(timeout_s=600)
    replacement = cluster.executor_pids()
    code = _PAUSED_IN.findall(cluster.executor_logs(cluster.apps() - before))
    # Each executor ran the sink's code from the zip the driver shipped.
    shipped = f"{shipping.zip_name()}/spark_outbox/spark/phases.py"
    assert len(code) >= 2 and all(c.endswith(shipped) for c in code), code
    outcomes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [o["status"] for o in outcomes] == ["committed"] * len(DATES)
    assert invisible > 0 and victims[0] not in replacement
    assert _digest(engine) == _digest(clean)
    assert table(engine, LEFTOVERS)[0][0] == 0
    assert_invariants(engine)


_PAUSED_IN = re.compile(r"outbox-phase: effects_written \(pid \d+, code (\S+)\)")


def _wait_for_invisible_rows(engine: Engine, driver: Driver, timeout_s: float = 300) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = int(table(engine, INVISIBLE)[0][0])
        if rows:
            return rows
        assert driver.proc.poll() is None, f"driver exited: {driver.stderr[-20:]}"
        time.sleep(0.2)
    raise TimeoutError("no executor wrote effects")


@pytest.mark.timeout(1200)
def test_stream_on_a_cluster_with_an_executor_killed_mid_batch_and_the_driver_between_batches(
    spark: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    tmp_path: Path,
    executor_python: Path,
    cluster: Any,
) -> None:
    events = tmp_path / "events"
    generate(events, customers=6, events=120, seed=23, bad_rows=2, days=2)
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_billing_endpoints(e)
    for query in billing_run.start_stream(
        spark, events, tmp_path / "clean-cp", clean_url, available_now=True
    ):
        query.awaitTermination()
    expected = run_state(clean, stream=True)

    # The first driver's executors pause 3 s after their first chunk of effects (the
    # kill lands mid-write); the driver pauses 30 s after each commit (its kill lands
    # between micro-batches). The restarted driver's executors do not pause.
    args = ["--mode", "stream", "--input", str(events), "--master", cluster.master_url]
    command = billing_command(*args, "--checkpoint", str(tmp_path / "cp"), "--available-now")
    executors = {"PYSPARK_PYTHON": str(executor_python)}
    pause = {**executor_env(OUTBOX_SPARK_PHASES="effects_written:3"), **executors}
    driver = Driver(command, db_url, env={**pause, "OUTBOX_SPARK_PHASES": "after_commit:30"})
    assert driver.wait_for("writing", timeout_s=300)
    _wait_for_invisible_rows(engine, driver)
    victims = cluster.executor_pids()
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)
    driver.forget_phases()
    committed = driver.wait_for("after_commit", timeout_s=600)  # the killed batch did
    assert committed, f"driver exited: {driver.stderr[-30:]}"
    driver.kill()  # paused after that commit: between two micro-batches
    committed_before_restart = int(table(engine, "SELECT count(*) FROM batches")[0][0])
    Driver(command, db_url, env=executors).finish(timeout_s=900)
    replacement = cluster.executor_pids()
    assert committed_before_restart >= 1 and victims[0] not in replacement
    assert run_state(engine, stream=True) == expected
    assert_invariants(engine)


@pytest.mark.timeout(1200)
def test_billing_through_a_connect_server_on_the_standalone_cluster_equals_a_classic_run(
    spark: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    tmp_path: Path,
    cluster: Any,
) -> None:
    """A Spark Connect server whose master is the cluster (test_connect.py has the
    local ones): its executors, separate JVMs, write the batch; the commit is the
    client's, a process of its own (``outbox spark run billing --remote``)."""
    from spark_outbox.cli.tools.connectserver import ConnectServer

    events = tmp_path / "events"
    generate(events, customers=8, events=120, seed=31, bad_rows=3, days=1)
    classic_url, classic = second_db
    for e in (engine, classic):
        insert_billing_endpoints(e)
    billing_run.run_batch(spark, events, DATES[0], classic_url)
    args = ["--mode", "batch", "--input", str(events), "--date", DATES[0]]
    with ConnectServer(tmp_path / "server", master=cluster.master_url) as server:
        out = Driver(billing_command(*args, "--remote", server.url), db_url).finish(600)
        ran_on = len(cluster.executor_pids())
    outcome = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    assert outcome["status"] == "committed"
    assert ran_on == 2
    assert _digest(engine) == _digest(classic)
