"""The job's own result rows get the effects' contract: a row the results table
refuses (a null, a value of the wrong type, a failed CHECK) is a reject naming the
column, and the good rows commit; ``on_invalid="fail"`` refuses the batch in one line."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.spark.outcome import BatchNotCommitted, InvalidRows
from spark_outbox.spark.results import ResultsSpec
from tests import ROOT
from tests.conftest import insert_endpoint
from tests.spark.helpers import (
    EFFECT_SCHEMA,
    INVOICE_SCHEMA,
    INVOICES_SNAPSHOT,
    effect_rows,
    invoice_rows,
    marker,
    sink,
    table,
)

pytestmark = pytest.mark.spark

# A results table with the constraints a real one has: NOT NULL, a typed column, a CHECK.
SCORES_DDL = """
CREATE TABLE scores (
    customer_id text PRIMARY KEY,
    score integer NOT NULL CHECK (score BETWEEN 0 AND 100),
    scored_on date,
    grade varchar(2)
)
"""
SCORES = ResultsSpec("scores", ("customer_id",))
SPARK_DOC = (ROOT / "docs" / "spark.md").read_text()


@pytest.fixture
def hook(engine: Engine) -> Engine:
    insert_endpoint(engine, "hook")
    return engine


def _null_invoice_id(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    bad = (None, "c-null", dt.date(2026, 1, 1), "EUR", Decimal(1), 1, 1, None, "t", "b1")
    return [*rows, bad]


def test_a_result_row_with_a_null_business_id_is_rejected_and_the_good_rows_commit(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results = spark.createDataFrame(_null_invoice_id(invoice_rows(5)), INVOICE_SCHEMA)
    effects = spark.createDataFrame(effect_rows(4), EFFECT_SCHEMA)
    outcome = sink(db_url).write(results, effects, batch_id="b1")
    assert (outcome.status, outcome.result_rows, outcome.effects_new) == ("committed", 5, 4)
    assert outcome.rejects == 1
    assert len(table(hook, INVOICES_SNAPSHOT)) == 5
    [(reason, customer)] = table(hook, "SELECT reason, raw_row->>'customer_id' FROM rejects")
    assert reason.startswith("invoices.invoice_id: null"), reason
    assert reason in SPARK_DOC  # the reason the docs show
    assert customer == "c-null"
    assert marker(hook, "b1")["rejects"] == 1


def test_rows_of_the_wrong_type_or_failing_a_check_are_rejected_naming_the_column(
    spark: Any, db_url: str, hook: Engine
) -> None:
    with hook.begin() as conn:
        conn.execute(sa.text(SCORES_DDL))
    rows = [
        ("c1", 10, "2026-01-01", "A"),
        ("c2", 101, "2026-01-01", "B"),  # CHECK fails
        ("c3", 20, "not a date", "C"),  # not a date
        ("c4", 30, "2026-01-01", "TOO LONG"),  # longer than varchar(2)
        ("c5", None, "2026-01-01", "D"),  # NOT NULL
        ("c6", 60, None, None),
    ]
    results = spark.createDataFrame(
        rows, "customer_id string, score int, scored_on string, grade string"
    )
    effects = spark.createDataFrame([], EFFECT_SCHEMA)
    outcome = sink(db_url, results=SCORES).write(results, effects, batch_id="b1")
    assert (outcome.result_rows, outcome.rejects) == (2, 4)
    assert table(hook, "SELECT customer_id FROM scores ORDER BY 1") == [("c1",), ("c6",)]
    reasons = dict(table(hook, "SELECT raw_row->>'customer_id', reason FROM rejects"))
    assert reasons["c2"].startswith("scores.score: "), reasons
    assert "ck_" in reasons["c2"] or "check" in reasons["c2"], reasons
    assert reasons["c3"].startswith("scores.scored_on: "), reasons
    assert reasons["c4"].startswith("scores.grade: "), reasons
    assert reasons["c5"].startswith("scores.score: null"), reasons
    for shown in ("c2", "c3"):
        assert reasons[shown] in SPARK_DOC, reasons[shown]  # the reasons the docs show


def test_on_invalid_fail_refuses_the_batch_in_one_line_naming_the_column(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results = spark.createDataFrame(_null_invoice_id(invoice_rows(3)), INVOICE_SCHEMA)
    effects = spark.createDataFrame(effect_rows(2), EFFECT_SCHEMA)
    with pytest.raises(InvalidRows) as raised:
        sink(db_url, on_invalid="fail").write(results, effects, batch_id="b1")
    message = str(raised.value)
    assert "\n" not in message and "invoices.invoice_id: null" in message, message
    assert raised.value.__cause__ is None and raised.value.__context__ is None  # no SQL trace
    assert table(hook, "SELECT count(*) FROM invoices")[0][0] == 0
    assert table(hook, "SELECT count(*) FROM batches")[0][0] == 0
    assert table(hook, "SELECT count(*) FROM rejects")[0][0] == 0


def test_result_rows_repeating_a_conflict_key_fail_the_batch_in_one_line(
    spark: Any, db_url: str, hook: Engine
) -> None:
    rows = invoice_rows(3)
    results = spark.createDataFrame([*rows, rows[1]], INVOICE_SCHEMA)
    effects = spark.createDataFrame(effect_rows(2), EFFECT_SCHEMA)
    with pytest.raises(BatchNotCommitted) as raised:
        sink(db_url).write(results, effects, batch_id="b1")
    message = str(raised.value)
    assert "\n" not in message and "invoice_id" in message and "inv1" in message, message
    assert table(hook, "SELECT count(*) FROM batches")[0][0] == 0


def test_a_rerun_after_rejected_result_rows_is_a_replay(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results = spark.createDataFrame(_null_invoice_id(invoice_rows(2)), INVOICE_SCHEMA)
    effects = spark.createDataFrame(effect_rows(2), EFFECT_SCHEMA)
    assert sink(db_url).write(results, effects, batch_id="b1").rejects == 1
    again = sink(db_url).write(results, effects, batch_id="b1")
    assert again.status == "replayed"
    assert table(hook, "SELECT count(*) FROM rejects")[0][0] == 1


def test_the_logging_lines_the_docs_show_print_the_sinks_batch_lines(
    db_url: str, engine: Engine
) -> None:
    from spark_outbox.core import db

    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO batches (job, batch_id, run_id) VALUES ('t', 'b1', gen_random_uuid())"
            )
        )
    recipe = re.search(r"<!-- spark-logging-example -->\s*```python\n(.*?)```", SPARK_DOC, re.S)
    assert recipe is not None
    script = (
        recipe.group(1)
        + "from spark_outbox.spark.sink import OutboxSink\n"
        + f"OutboxSink(job='t', database_url={db.libpq_url(db_url)!r}).replayed('b1')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "INFO spark_outbox.spark.sink: batch replayed" in done.stderr, done.stderr
