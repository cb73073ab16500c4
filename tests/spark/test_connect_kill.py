"""The Spark Connect server killed in the middle of a stream's commit; restarted, the
stream resumes from its checkpoint and the database equals one clean run.

Under Connect a stream's foreachBatch, and so the sink's commit, runs in a
Python worker of the server. The client (tests/spark/connect_client.py, a
process of its own) starts a stream of numbers, one effect each, one file per
micro-batch; the server's workers pause at a phase (``OUTBOX_SPARK_PHASES`` in
the server's environment), and the server is SIGKILLed with every Python
worker it started, as a lost host: once before COMMIT, once just after it
(Spark's checkpoint then does not know the batch committed: its replay must be
skipped). A third start runs to the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.connectserver import ConnectServer
from tests.conftest import insert_endpoint
from tests.invariants import assert_invariants
from tests.spark.helpers import EFFECTS_SNAPSHOT, numbers_query, sink, table
from tests.spark.killing import NO_WORKER, Driver

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TRIES = 5  # client starts, when the server's foreachBatch worker missed its window
LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)


def _state(engine: Engine) -> tuple[Any, ...]:
    """Batch ids carry the checkpoint's query id: compared by their numbers."""
    effects = [(*r[:2], *r[3:]) for r in table(engine, EFFECTS_SNAPSHOT)]
    markers = table(engine, "SELECT batch_id, effects_new, rejects FROM batches ORDER BY 1")
    return (
        effects,
        [(b.split("/")[1], *rest) for b, *rest in markers],
        table(engine, LEFTOVERS)[0][0],
    )


def _output(client: Driver) -> str:
    out = client.proc.stdout.read() if client.proc.stdout else ""
    return "".join(client.stderr) + out


def _client_at_phase(server: ConnectServer, command: list[str], db_url: str, phase: str) -> Driver:
    """A client whose stream's server-side worker reached ``phase`` (and pauses there)."""
    for _ in range(TRIES):
        client = Driver(command, db_url)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and client.proc.poll() is None:
            if f"outbox-phase: {phase} " in server.log():
                return client
            time.sleep(0.5)
        said = _output(client)
        client.kill_all()
        assert NO_WORKER in said, f"client: {said[-3000:]}"
    raise TimeoutError(f"the server never reached {phase}: {server.log()[-3000:]}")


@pytest.fixture
def source(engine: Engine, second_db: tuple[str, Engine], tmp_path: Path) -> Path:
    for e in (engine, second_db[1]):
        insert_endpoint(e, "hook")
    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(3):
        rows = (json.dumps({"n": n, "v": 1}) for n in range(part * 5, part * 5 + 5))
        (folder / f"part{part}.json").write_text("\n".join(rows))
    return folder


@pytest.mark.timeout(2700)
def test_the_connect_server_killed_mid_commit_then_restarted_equals_a_clean_run(
    spark: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    source: Path,
    tmp_path: Path,
) -> None:
    clean_url, clean = second_db
    clean_sink = sink(clean_url, results=None)
    query = numbers_query(spark, source, tmp_path / "clean", clean_sink, checkpoint_argument=True)
    assert query.awaitTermination(600) and query.exception() is None
    expected = _state(clean)

    server = ConnectServer(tmp_path / "server")
    client = [sys.executable, "-m", "tests.spark.connect_client", server.url]
    command = [*client, str(source), str(tmp_path / "cp"), "--checkpoint-argument"]
    try:
        for phase in ("before_commit", "after_commit"):
            server.env["OUTBOX_SPARK_PHASES"] = f"{phase}:30"
            server.start()
            victim = _client_at_phase(server, command, db_url, phase)
            server.kill()
            victim.kill_all()
        del server.env["OUTBOX_SPARK_PHASES"]
        server.start()
        for _ in range(TRIES):
            ended = json.loads(Driver(command, db_url).finish().splitlines()[-1])
            if NO_WORKER not in (ended["error"] or ""):
                break
    finally:
        server.stop()
    assert ended["error"] is None, ended
    assert _state(engine) == expected
    assert_invariants(engine)
