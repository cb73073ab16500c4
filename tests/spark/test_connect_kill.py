"""The Spark Connect server killed in the middle of a stream's commit; restarted, the
stream resumes from its checkpoint and the database equals one clean run.

Under Connect a stream's foreachBatch, and so the sink's commit, runs in a
Python worker of the server. The client (``outbox spark run billing --mode
stream --remote``) starts the billing stream; the server's workers pause at a
phase (``OUTBOX_SPARK_PHASES`` in the server's environment), and the server is
SIGKILLed with every Python worker it started, as a lost host: once before
COMMIT, once just after it (Spark's checkpoint then does not know the batch
committed: its replay must be skipped). A third start runs to the end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from spark_outbox.cli.tools.connectserver import ConnectServer
from tests.conftest import insert_billing_endpoints
from tests.invariants import assert_invariants
from tests.spark.helpers import EFFECTS_SNAPSHOT, INVOICES_SNAPSHOT, table
from tests.spark.killing import NO_WORKER, Driver, billing_command

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REJECTS = "SELECT job, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3"
LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)


def _state(engine: Engine) -> tuple[Any, ...]:
    """Batch ids carry the checkpoint's query id: effects compared without them."""
    effects = [(*r[:2], *r[3:]) for r in table(engine, EFFECTS_SNAPSHOT)]
    return (
        table(engine, INVOICES_SNAPSHOT),
        effects,
        table(engine, REJECTS),
        table(engine, LEFTOVERS)[0][0],
    )


TRIES = 5


def _client_at_phase(server: ConnectServer, command: list[str], db_url: str, phase: str) -> Driver:
    """A client whose stream's server-side worker reached ``phase`` (and pauses there)."""
    for _ in range(TRIES):
        client = Driver(command, db_url)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and client.proc.poll() is None:
            if f"outbox-phase: {phase} " in server.log():
                return client
            time.sleep(0.5)
        client.kill_all()
        assert NO_WORKER in "".join(client.stderr), f"client: {client.stderr[-20:]}"
    raise TimeoutError(f"the server never reached {phase}: {server.log()[-3000:]}")


@pytest.mark.timeout(2700)
def test_the_connect_server_killed_mid_commit_then_restarted_equals_a_clean_run(
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
    expected = _state(clean)

    server = ConnectServer(tmp_path / "server")
    args = ["--mode", "stream", "--input", str(events), "--checkpoint", str(tmp_path / "cp")]
    command = billing_command(*args, "--available-now", "--remote", server.url)
    try:
        for phase in ("before_commit", "after_commit"):
            server.env["OUTBOX_SPARK_PHASES"] = f"{phase}:30"
            server.start()
            client = _client_at_phase(server, command, db_url, phase)
            server.kill()
            client.kill_all()
        del server.env["OUTBOX_SPARK_PHASES"]
        server.start()
        Driver(command, db_url).finish()
    finally:
        server.stop()
    assert _state(engine) == expected
    assert_invariants(engine)
