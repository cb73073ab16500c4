"""The billing example end to end on local Spark: batch and streaming."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.billing import run as billing_run
from spark_outbox.billing.generate import generate
from tests.conftest import insert_billing_endpoints
from tests.spark.helpers import EFFECTS_SNAPSHOT, table

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def billing_db(engine: Engine) -> Engine:
    insert_billing_endpoints(engine)
    return engine


def test_batch_bills_a_day_and_rejects_every_bad_row(
    spark: Any, db_url: str, billing_db: Engine, tmp_path: Path
) -> None:
    generate(tmp_path, customers=15, events=300, seed=5, bad_rows=5, days=1)
    outcome = billing_run.run_batch(spark, tmp_path, "2026-01-01", db_url)
    invoices = table(billing_db, "SELECT customer_id, amount, units FROM invoices")
    assert outcome["status"] == "committed" and outcome["result_rows"] == len(invoices)
    # 15 customers seen + 1 without e-mail; one webhook per invoice, e-mail when possible.
    assert len(invoices) == 16
    assert outcome["effects_new"] == 2 * 16 - 1
    reasons = sorted(r[0].split(":")[0] for r in table(billing_db, "SELECT reason FROM rejects"))
    assert reasons == ["customer_id", "recipient", "ts", "unit_price", "units"]
    assert outcome["rejects"] == 5
    again = billing_run.run_batch(spark, tmp_path, "2026-01-01", db_url)
    assert again["status"] == "replayed"
    assert len(table(billing_db, EFFECTS_SNAPSHOT)) == 31


def _run_stream(spark: Any, data: Path, checkpoint: Path, db_url: str) -> None:
    for query in billing_run.start_stream(spark, data, checkpoint, db_url, available_now=True):
        query.awaitTermination()


def test_stream_rerun_from_a_new_checkpoint_enqueues_nothing_new_and_shows_changed_input(
    spark: Any, db_url: str, billing_db: Engine, tmp_path: Path
) -> None:
    data = tmp_path / "in"
    generate(data, customers=10, events=200, seed=9, bad_rows=2, days=3)
    _run_stream(spark, data, tmp_path / "cp1", db_url)
    first = table(billing_db, EFFECTS_SNAPSHOT)
    # Days 1 and 2 are closed by the watermark; day 3 stays open (no later event).
    days = table(billing_db, "SELECT DISTINCT invoice_date FROM invoices ORDER BY 1")
    assert [str(d[0]) for d in days] == ["2026-01-01", "2026-01-02"]
    assert table(billing_db, "SELECT count(*) FROM rejects")[0][0] == 2

    _run_stream(spark, data, tmp_path / "cp2", db_url)
    assert table(billing_db, EFFECTS_SNAPSHOT) == first
    assert _run_totals(billing_db, tmp_path / "cp2") == (0, 0)

    changed = tmp_path / "changed"  # a corrected copy of the input
    shutil.copytree(data, changed)
    day1 = changed / "events-2026-01-01.json"
    rows = [json.loads(line) for line in day1.read_text().splitlines()]
    good = next(r for r in rows if r["units"] > 0 and r["unit_price"] and r["ts"].endswith("Z"))
    good["units"] += 1000  # changed input: one customer's day-1 invoice differs
    mtime = day1.stat().st_mtime  # the file source reads files in modification order
    day1.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(day1, (mtime, mtime))
    _run_stream(spark, changed, tmp_path / "cp3", db_url)
    assert _run_totals(billing_db, tmp_path / "cp3") == (0, 2)  # its webhook and its e-mail
    assert table(billing_db, EFFECTS_SNAPSHOT) == first  # the first payloads won


def _run_totals(engine: Engine, checkpoint: Path) -> tuple[int, int]:
    """New effects and payload mismatches of the invoices query run on ``checkpoint``."""
    query_id = json.loads((checkpoint / "invoices" / "metadata").read_text())["id"]
    rows = table(
        engine,
        "SELECT coalesce(sum(effects_new), 0), coalesce(sum(payload_mismatches), 0) "
        f"FROM batches WHERE job = 'billing.stream' AND batch_id LIKE '{query_id}/%'",
    )
    return int(rows[0][0]), int(rows[0][1])
