"""kill -9 of the Spark driver at named and random points; a re-run equals a clean run.

Every victim run is a real driver process (``python -m spark_outbox spark run billing``)
SIGKILLed by this test. Named points pause the driver (or an executor) at a
phase: an executor mid-write (its first chunk of effects committed into the
outbox, invisible), after the executors wrote and before the marker, just
before and just after COMMIT. Random points wait for the write to begin, sleep
a seeded random delay and kill. The seed is printed, so a failure reproduces
with OUTBOX_KILL_SEED. One driver JVM per victim is the cost of a real kill, so
the random points are few (OUTBOX_RANDOM_KILLS, 3); the named ones cover each
step of the protocol.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from tests.conftest import insert_billing_endpoints
from tests.invariants import assert_invariants
from tests.spark.helpers import run_state as _state
from tests.spark.helpers import table
from tests.spark.killing import Driver, billing_command

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# One small day per kill: a killed run leaves later days for the next run, so every
# kill (4 named + RANDOM_KILLS random) lands in a write that has not committed yet.
RANDOM_KILLS = int(os.environ.get("OUTBOX_RANDOM_KILLS", "1"))  # more in a soak run
NAMED = ("effects_written", "written", "before_commit", "after_commit")
DATES = tuple(f"2026-01-{d:02d}" for d in range(1, len(NAMED) + RANDOM_KILLS + 2))


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("events")
    generate(out, customers=6, events=25 * len(DATES), seed=11, bad_rows=5, days=len(DATES))
    return out


@pytest.mark.timeout(2400)
def test_batch_killed_at_named_and_random_points_then_rerun_equals_a_clean_run(
    spark: Any, db_url: str, engine: Engine, second_db: tuple[str, Engine], events: Path
) -> None:
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_billing_endpoints(e)
    for date in DATES:
        billing_run.run_batch(spark, events, date, clean_url)
    expected = _state(clean)

    seed = int(os.environ.get("OUTBOX_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill seed: {seed} (set OUTBOX_KILL_SEED={seed} to reproduce)")
    rng = random.Random(seed)
    args = ["--mode", "batch", "--input", str(events)]
    args += [a for d in DATES for a in ("--date", d)]
    command = billing_command(*args)
    killed_at = []
    for phase in NAMED:  # an executor's pause is shorter: its task may run twice
        pause_s = "10" if phase == "effects_written" else "20"
        driver = Driver(command, db_url, {"OUTBOX_SPARK_PHASES": f"{phase}:{pause_s}"})
        if driver.wait_for(phase):
            killed_at.append(phase)
        driver.kill()
    for _ in range(RANDOM_KILLS):
        driver = Driver(command, db_url)
        delay = rng.uniform(0, 3.0)
        if driver.wait_for("writing"):
            time.sleep(delay)  # lands in the write, the commit or just after
            killed_at.append(f"writing+{delay:.2f}s")
        driver.kill()
        print(f"killed at {killed_at[-1] if killed_at else 'start'}", flush=True)
    assert tuple(killed_at[: len(NAMED)]) == NAMED
    assert len(killed_at) == len(NAMED) + RANDOM_KILLS, killed_at  # every kill hit a live write
    Driver(command, db_url).finish()
    assert _state(engine) == expected, f"kills: {killed_at}"
    markers = table(engine, "SELECT batch_id, effects_new FROM batches ORDER BY 1")
    assert [m[0] for m in markers] == list(DATES)
    assert_invariants(engine)


@pytest.mark.timeout(1200)
def test_stream_killed_and_restarted_from_its_checkpoint_equals_a_clean_run(
    spark: Any, db_url: str, engine: Engine, second_db: tuple[str, Engine], tmp_path: Path
) -> None:
    events = tmp_path / "events"
    generate(events, customers=8, events=150, seed=12, bad_rows=3, days=3)
    clean_url, clean = second_db
    for e in (engine, clean):
        insert_billing_endpoints(e)
    for query in billing_run.start_stream(
        spark, events, tmp_path / "clean-cp", clean_url, available_now=True
    ):
        query.awaitTermination()
    expected = _state(clean, stream=True)

    checkpoint = tmp_path / "cp"
    command = billing_command(
        "--mode",
        "stream",
        "--input",
        str(events),
        "--checkpoint",
        str(checkpoint),
        "--available-now",
    )
    driver = Driver(command, db_url, {"OUTBOX_SPARK_PHASES": "before_commit"})
    assert driver.wait_for("before_commit")
    driver.kill()
    driver = Driver(command, db_url, {"OUTBOX_SPARK_PHASES": "after_commit"})
    assert driver.wait_for("after_commit")
    driver.kill()
    Driver(command, db_url).finish()
    assert _state(engine, stream=True) == expected
    assert_invariants(engine)
