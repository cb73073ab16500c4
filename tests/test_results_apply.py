"""Result rows applied to a results table (spark_jobs/results.py), without Spark: the
statement the commit runs, on staged rows written here, on a real PostgreSQL."""

from __future__ import annotations

import itertools
import json
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import resultrows
from spark_outbox.spark import results
from spark_outbox.spark.results import ResultsSpec

_BATCHES = itertools.count(1)


def _stage(engine: Engine, rows: list[dict[str, object]]) -> uuid.UUID:
    run_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE IF NOT EXISTS tallies (tally_id text PRIMARY KEY, total int, note text)"
        )
        for row in rows:
            conn.execute(
                sa.text(
                    "INSERT INTO staged_results (run_id, task_id, row)"
                    " VALUES (:run_id, 1, CAST(:row AS jsonb))"
                ),
                {"run_id": run_id, "row": json.dumps(row)},
            )
    return run_id


def _apply(engine: Engine, spec: ResultsSpec, columns: tuple[str, ...], run_id: uuid.UUID) -> int:
    # The statement the commit runs (spark_outbox.spark.result_rejects runs it under a
    # savepoint), with the digest's settings pinned as the commit pins them.
    with engine.begin() as conn:
        resultrows.pin_settings(conn)
        params = {"run_id": str(run_id), "task_ids": [1], "batch_ref": next(_BATCHES)}
        return int(conn.execute(results.apply_statement(conn, spec, columns), params).scalar_one())


def _tallies(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT * FROM tallies ORDER BY 1")]


def test_keys_only_results_insert_new_keys_and_keep_the_rows_already_there(
    engine: Engine,
) -> None:
    adding = ResultsSpec("tallies", ("tally_id",), "add", ("total",))
    first = _stage(engine, [{"tally_id": "a", "total": 5, "note": "kept"}])
    assert _apply(engine, adding, ("tally_id", "total", "note"), first) == 1
    # Only the conflict key: nothing to overwrite or add, a key already there is left as it is.
    again = _stage(engine, [{"tally_id": "a"}, {"tally_id": "b"}])
    assert _apply(engine, ResultsSpec("tallies", ("tally_id",)), ("tally_id",), again) == 1
    assert _tallies(engine) == [("a", 5, "kept"), ("b", None, None)]
    # The same rows with a column to add: the DO UPDATE statement, not the keys-only one.
    more = _stage(engine, [{"tally_id": "a", "total": 2}])
    assert _apply(engine, adding, ("tally_id", "total"), more) == 1
    assert _tallies(engine) == [("a", 7, "kept"), ("b", None, None)]


def test_a_results_frame_lacking_a_not_null_column_without_default_is_refused_naming_it(
    engine: Engine,
) -> None:
    import pytest

    from spark_outbox.core.errors import ConfigurationError

    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE scored (id text PRIMARY KEY, score int NOT NULL, "
            "at timestamptz NOT NULL DEFAULT now())"
        )
        spec = ResultsSpec("scored", ("id",))
        with pytest.raises(ConfigurationError, match=r"lacks column\(s\) \['score'\]"):
            results.apply_statement(conn, spec, ("id",))
        results.apply_statement(conn, spec, ("id", "score"))  # 'at' has a default: not required
