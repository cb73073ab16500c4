"""Reconciliation re-reads the results table by content: real Spark (local[2]) commits
real batches through the sink, the table is then damaged by hand, and every damaged
row is named, however the counts add up."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import reconcile
from spark_outbox.spark.results import ResultsSpec
from tests.conftest import insert_endpoint
from tests.spark.helpers import EFFECT_SCHEMA, INVOICE_SCHEMA, effect_rows, invoice_rows, sink

pytestmark = pytest.mark.spark

STAMPED = ResultsSpec("invoices", ("invoice_id",), batch_columns=("job", "batch_id"))


def _write(spark: Any, db_url: str, batch_id: str, invoices: list[Any], effects: int) -> None:
    results = spark.createDataFrame(invoices, INVOICE_SCHEMA)
    rows = spark.createDataFrame(effect_rows(effects, version=hash(batch_id)), EFFECT_SCHEMA)
    outcome = sink(db_url, results=STAMPED).write(results, rows, batch_id=batch_id)
    assert outcome.status == "committed"


def _lines(found: reconcile.BatchReconciliation) -> dict[str, tuple[int, list[Any]]]:
    return {line.category: (line.count, line.keys) for line in found.results.lines}


def _check(engine: Engine, batch_id: str) -> reconcile.BatchReconciliation:
    with engine.connect() as conn:
        return reconcile.batch(conn, "t", batch_id)


def test_a_missing_and_a_foreign_result_row_are_both_named_though_the_count_holds(
    spark: Any, db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    insert_endpoint(engine, "hook")
    _write(spark, db_url, "b1", invoice_rows(4, batch_id="b1"), effects=3)
    clean = _check(engine, "b1")
    assert _lines(clean) == {"as_written": (4, []), "overwritten": (0, [])}
    assert clean.unexplained == 0 and clean.results.recorded == 4
    with engine.begin() as conn:
        # inv0 gone, inv9 stamped b1 though b1 never wrote it: still 4 rows of b1.
        conn.execute(sa.text("DELETE FROM invoices WHERE invoice_id = 'inv0'"))
        conn.execute(
            sa.text(
                "INSERT INTO invoices SELECT 'inv9', customer_id, invoice_date, currency, amount,"
                " units, event_count, customer_email, job, batch_id, updated_at"
                " FROM invoices WHERE invoice_id = 'inv1'"
            )
        )
        conn.execute(sa.text("UPDATE invoices SET amount = amount + 1 WHERE invoice_id = 'inv2'"))
        count = conn.execute(sa.text("SELECT count(*) FROM invoices WHERE batch_id = 'b1'"))
        assert count.scalar_one() == 4  # what a count-based check would compare
    found = _lines(_check(engine, "b1"))
    assert found["missing"] == (1, [{"invoice_id": "inv0"}])
    assert found["foreign"] == (1, [{"invoice_id": "inv9"}])
    assert found["changed"] == (1, [{"invoice_id": "inv2"}])
    assert found["as_written"][0] == 2
    assert _check(engine, "b1").unexplained == 3
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        assert main(["--log-format", "text", "reconcile", "t", "b1"]) == 1
    out = capsys.readouterr().out
    assert '{"invoice_id": "inv0"}' in out and '{"invoice_id": "inv9"}' in out


def test_a_row_a_later_batch_overwrote_is_explained_and_said_to_be_unknowable(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    _write(spark, db_url, "b1", invoice_rows(3, batch_id="b1"), effects=1)
    later = [(*row[:4], row[4] + 1, *row[5:8], "t", "b2") for row in invoice_rows(3)][1:]
    _write(spark, db_url, "b2", later, effects=1)
    first = _check(engine, "b1")
    assert _lines(first)["overwritten"] == (2, [{"invoice_id": "inv1"}, {"invoice_id": "inv2"}])
    assert _lines(first)["as_written"] == (1, [])
    assert first.unexplained == 0
    assert any("later batch wrote again" in note for note in first.results.cannot_know)
    second = _check(engine, "b2")
    assert _lines(second)["as_written"] == (2, []) and second.unexplained == 0


def test_a_missing_and_a_foreign_effect_row_are_both_reported(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    _write(spark, db_url, "b1", invoice_rows(1, batch_id="b1"), effects=3)
    _write(spark, db_url, "b2", invoice_rows(1, batch_id="b2"), effects=0)
    with engine.begin() as conn:
        gone = conn.execute(
            sa.text(
                "DELETE FROM effects WHERE id = (SELECT min(id) FROM effects"
                " WHERE batch_id = 'b1') RETURNING idempotency_key"
            )
        ).scalar_one()
        # A row carrying b1's job and batch id, visible through b2's marker.
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload,"
                " payload_sha256) SELECT :k, 't', 'b1', run_id, 'hook', '{}', 'x'"
                " FROM batches WHERE batch_id = 'b2'"
            ),
            {"k": "f" * 64},
        )
    found = _check(engine, "b1")
    counts = {line.category: line.count for line in found.lines if line.count}
    assert counts["missing"] == 1 and counts["foreign"] == 1
    assert found.foreign_keys == ["f" * 64] and gone not in found.foreign_keys
    assert found.unexplained == 2
    assert json.loads(json.dumps(reconcile.as_dict(found), default=str))["unexplained"] == 2
