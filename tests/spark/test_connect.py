"""The sink through Spark Connect: a thin gRPC client, no sparkContext, no rdd.

One Connect server (``connect_server``: ``spark-submit`` of PySpark's own
SparkConnectServer on loopback, local[2]) serves every test here. A process
holds classic or Connect sessions, not both (PySpark picks its functions by
process), so every client is a process of its own: ``outbox spark run billing
--remote`` or tests/spark/connect_client.py. The billing job's batch write and
preview end exactly as from a classic driver; a stream's foreachBatch runs on
the server, where the query id is read from the checkpoint it is given, and
without one the sink refuses naming the fix. The server's kills are in
test_connect_kill.py; a Connect server whose master is the standalone cluster, in
test_cluster.py (with every test on that cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from tests import ROOT
from tests.conftest import insert_billing_endpoints, insert_endpoint
from tests.spark.helpers import EFFECTS_SNAPSHOT, INVOICES_SNAPSHOT, table
from tests.spark.killing import NO_WORKER, billing_command

pytestmark = pytest.mark.spark
MARKERS = (
    "SELECT job, batch_id, result_rows, effects_total, effects_new, effects_deduplicated, "
    "payload_mismatches, rejects FROM batches ORDER BY 1, 2"
)
REJECTS = "SELECT job, batch_id, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3, 4"
DATE = "2026-01-01"


def _digest(engine: Engine) -> tuple[Any, ...]:
    return tuple(
        table(engine, sql) for sql in (INVOICES_SNAPSHOT, EFFECTS_SNAPSHOT, MARKERS, REJECTS)
    )


def _client(command: list[str], db_url: str) -> list[dict[str, Any]]:
    """Run a Connect client process to its end; its JSON lines."""
    env = {**os.environ, "DATABASE_URL": db_url}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _billing(server: Any, db_url: str, events: Path, *extra: str) -> dict[str, Any]:
    args = ["--mode", "batch", "--input", str(events), "--date", DATE, "--remote", server.url]
    return _client(billing_command(*args, *extra), db_url)[0]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("events")
    generate(out, customers=8, events=120, seed=31, bad_rows=3, days=1)
    return out


@pytest.mark.timeout(900)
def test_billing_batch_through_spark_connect_equals_a_classic_run_and_replays_nothing(
    spark: Any,
    connect_server: Any,
    db_url: str,
    engine: Engine,
    second_db: tuple[str, Engine],
    events: Path,
) -> None:
    classic_url, classic = second_db
    for e in (engine, classic):
        insert_billing_endpoints(e)
    billing_run.run_batch(spark, events, DATE, classic_url)
    outcome = _billing(connect_server, db_url, events)
    assert outcome["status"] == "committed" and outcome["effects_new"] > 0
    assert _digest(engine) == _digest(classic)
    app_id = table(engine, "SELECT spark_app_id FROM batches")[0][0]
    # The server's application (a local master's), not this process's own session.
    assert app_id.startswith("local-") and app_id != spark.sparkContext.applicationId
    again = _billing(connect_server, db_url, events)
    assert again["status"] == "replayed" and again["original"]["effects_new"] > 0
    assert _digest(engine) == _digest(classic)


@pytest.mark.timeout(900)
def test_preview_through_spark_connect_reports_what_a_write_would_do_and_writes_nothing(
    connect_server: Any, db_url: str, engine: Engine, events: Path
) -> None:
    insert_billing_endpoints(engine)
    shown = _billing(connect_server, db_url, events, "--dry-run", "--json")
    assert table(engine, "SELECT count(*) FROM effects")[0][0] == 0
    assert table(engine, "SELECT count(*) FROM batch_runs")[0][0] == 0
    written = _billing(connect_server, db_url, events)
    assert shown["committed_before"] is False
    assert (shown["effects_new"], shown["rejects"]) == (
        written["effects_new"],
        written["rejects"],
    )


@pytest.fixture
def source(engine: Engine, tmp_path: Path) -> Path:
    insert_endpoint(engine, "hook")
    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(2):
        rows = (json.dumps({"n": n, "v": 1}) for n in range(part * 5, part * 5 + 5))
        (folder / f"part{part}.json").write_text("\n".join(rows))
    return folder


def _numbers(server: Any, db_url: str, source: Path, checkpoint: Path, *extra: str) -> Any:
    """The numbers stream from a client; started again if its foreachBatch worker did
    not connect back to the server in time (killing.NO_WORKER)."""
    command = [sys.executable, "-m", "tests.spark.connect_client", server.url]
    for _ in range(5):
        found = _client([*command, str(source), str(checkpoint), *extra], db_url)[0]
        if NO_WORKER not in (found["error"] or ""):
            return found
    return found


@pytest.mark.timeout(900)
def test_a_stream_through_spark_connect_takes_its_identity_from_the_checkpoint(
    connect_server: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "cp"
    first = _numbers(connect_server, db_url, source, checkpoint, "--checkpoint-argument")
    assert first["connect"] is True and first["error"] is None, first
    query_id = first["query_id"]
    before = table(engine, EFFECTS_SNAPSHOT)
    markers = table(engine, "SELECT batch_id, effects_new FROM batches ORDER BY 1")
    assert markers == [(f"{query_id}/0", 5), (f"{query_id}/1", 5)]
    for name in ("1", ".1.crc"):  # Spark forgets batch 1 committed: it runs it again
        os.remove(checkpoint / "commits" / name)
    again = _numbers(connect_server, db_url, source, checkpoint, "--checkpoint-argument")
    assert (again["query_id"], again["error"]) == (query_id, None)
    assert table(engine, "SELECT batch_id, effects_new FROM batches ORDER BY 1") == markers
    assert table(engine, EFFECTS_SNAPSHOT) == before


@pytest.mark.timeout(900)
def test_foreach_batch_under_connect_without_a_checkpoint_refuses_naming_the_fix(
    connect_server: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    found = _numbers(connect_server, db_url, source, tmp_path / "cp")
    assert "no stream identity" in found["error"] and "pass checkpoint=" in found["error"]
    assert table(engine, "SELECT count(*) FROM batch_runs")[0][0] == 0
    assert table(engine, "SELECT count(*) FROM effects")[0][0] == 0
