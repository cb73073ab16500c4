"""``format("outbox")`` killed at the protocol's steps; a re-run equals one clean run.

Every victim is a real driver process (tests/spark/source_client.py, local[2,3])
writing invoices with their effects arrays and a reject per negative number.
Spark runs a data source's commit in a Python worker of the driver's JVM, so a
lost driver host is the whole process group SIGKILLed. Batch: a Python worker
killed in the middle of its effects write (Spark tries the task again, which
finds its own rows), the driver killed before COMMIT and just after it. Stream:
the driver killed before COMMIT and after it, restarted from its checkpoint.
The database ends identical to one clean run of the same data.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.spark.source import register
from tests.conftest import insert_endpoint
from tests.invariants import assert_invariants
from tests.spark import source_client
from tests.spark.helpers import EFFECTS_SNAPSHOT, INVOICES_SNAPSHOT, table
from tests.spark.killing import Driver

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DATES = ("2026-01-01", "2026-01-02", "2026-01-03")
REJECTS = "SELECT job, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3"
LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)


def _state(engine: Engine, *, stream: bool = False) -> tuple[Any, ...]:
    effects = table(engine, EFFECTS_SNAPSHOT)
    markers = table(engine, "SELECT batch_id, effects_new, rejects FROM batches ORDER BY 1")
    if stream:  # batch ids carry the checkpoint's query id: compare the numbers
        effects = [(*r[:2], *r[3:]) for r in effects]
        markers = [(b.split("/")[1], *rest) for b, *rest in markers]
    return (
        table(engine, INVOICES_SNAPSHOT),
        effects,
        markers,
        table(engine, REJECTS),
        table(engine, LEFTOVERS)[0][0],
    )


@pytest.fixture
def numbers(tmp_path: Path) -> Path:
    folder = tmp_path / "numbers"
    folder.mkdir()
    for day, date in enumerate(DATES):
        rows = [{"n": day * 40 + n, "v": n % 3} for n in range(40)] + [{"n": -1 - day, "v": 0}]
        (folder / f"numbers-{date}.json").write_text("\n".join(json.dumps(r) for r in rows))
    return folder


def _options(db_url: str) -> dict[str, str]:
    return {**source_client.OPTIONS, "database_url": db_url}


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.spark.source_client", *args]


def _dates(*dates: str) -> list[str]:
    return [a for d in dates for a in ("--date", d)]


@pytest.mark.timeout(2400)
def test_a_batch_write_killed_in_a_worker_and_around_commit_then_rerun_equals_a_clean_run(
    spark: Any, db_url: str, engine: Engine, second_db: tuple[str, Engine], numbers: Path
) -> None:
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_endpoint(e, "hook")
    register(spark)
    # The clean run in this process (no driver to start): the same code as the victims.
    source_client.write_batches(spark, numbers, list(DATES), _options(clean_url))
    batch = _command("batch", str(numbers), *_dates(*DATES))
    expected = _state(clean)

    # A Python worker dies mid-write: its task is tried again, the batch commits.
    worker_env = {"OUTBOX_SPARK_PHASES": "effects_written:5"}
    worker = Driver(_command("batch", str(numbers), *_dates(DATES[0])), db_url, worker_env)
    assert worker.wait_for("effects_written")
    os.kill(worker.reached_pid(), signal.SIGKILL)
    worker.finish()
    killed = []
    for phase, date in (("before_commit", DATES[1]), ("after_commit", DATES[2])):
        driver = Driver(
            _command("batch", str(numbers), *_dates(date)),
            db_url,
            {"OUTBOX_SPARK_PHASES": f"{phase}:30"},
        )
        if driver.wait_for(phase):
            killed.append(phase)
        driver.kill_all()
    assert killed == ["before_commit", "after_commit"]
    Driver(batch, db_url).finish()
    assert _state(engine) == expected
    assert_invariants(engine)


@pytest.mark.timeout(2400)
def test_a_stream_killed_around_commit_and_restarted_from_its_checkpoint_equals_a_clean_run(
    spark: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    numbers: Path,
    tmp_path: Path,
) -> None:
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_endpoint(e, "hook")
    register(spark)
    source_client.run_stream(spark, numbers, tmp_path / "clean", _options(clean_url))
    expected = _state(clean, stream=True)

    stream = _command("stream", str(numbers), "--checkpoint", str(tmp_path / "cp"))
    for phase in ("before_commit", "after_commit"):
        driver = Driver(stream, db_url, {"OUTBOX_SPARK_PHASES": f"{phase}:30"})
        assert driver.wait_for(phase)
        driver.kill_all()
    Driver(stream, db_url).finish()
    assert _state(engine, stream=True) == expected
    assert_invariants(engine)
