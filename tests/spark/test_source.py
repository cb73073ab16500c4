"""``format("outbox")``: the Python data source, batch and streaming, against real
Spark (the run's local[2] session) and PostgreSQL.

It runs the sink's own protocol, so what it leaves is compared with what
``OutboxSink.write`` leaves for the same rows in a second database: results,
effects (keys, payloads, hashes), markers' counts and rejects. Then the hard
cases: replays, a stream restarted from its checkpoint and one on a fresh
checkpoint, refusals that name the fix, the volume guard; the kills are in
test_source_kill.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core.keys import effect_key
from spark_outbox.spark.source import register
from tests.conftest import insert_endpoint
from tests.spark.helpers import (
    EFFECT_SCHEMA,
    EFFECTS_SNAPSHOT,
    INVOICE_SCHEMA,
    INVOICES_SNAPSHOT,
    effect_rows,
    invoice_rows,
    sink,
    table,
)

pytestmark = pytest.mark.spark
MARKERS = (
    "SELECT job, batch_id, result_rows, effects_total, effects_new, effects_deduplicated, "
    "payload_mismatches, rejects, hold_state FROM batches ORDER BY 1, 2"
)
REJECTS = "SELECT job, batch_id, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3, 4"
LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)


def _digest(engine: Engine) -> tuple[Any, ...]:
    queries = (INVOICES_SNAPSHOT, EFFECTS_SNAPSHOT, MARKERS, REJECTS, LEFTOVERS)
    return tuple(table(engine, sql) for sql in queries)


def _write(frame: Any, db_url: str, **options: str) -> None:
    writer = frame.write.format("outbox").mode("append").option("database_url", db_url)
    writer.options(**{"job": "t", **options}).save()


def _bad_rows() -> list[tuple[Any, ...]]:
    return [
        ("not-a-key", "hook", json.dumps({"n": -1}), None),
        (effect_key("test.effect", 99), "nowhere", json.dumps({"n": 99}), None),
    ]


@pytest.fixture(autouse=True)
def registered(spark: Any) -> None:
    register(spark)


def test_an_effects_frame_commits_as_the_sink_would_and_its_replay_writes_nothing(
    spark: Any, db_url: str, engine: Engine, second_db: tuple[str, Engine]
) -> None:
    sink_url, by_sink = second_db
    for e in (engine, by_sink):
        insert_endpoint(e, "hook")
    frame = spark.createDataFrame(effect_rows(6) + _bad_rows(), EFFECT_SCHEMA)
    sink(sink_url, results=None).write(None, frame, batch_id="b1")
    _write(frame, db_url, batch_id="b1")
    expected = _digest(by_sink)
    assert _digest(engine) == expected
    assert table(engine, "SELECT effects_new, rejects FROM batches") == [(6, 2)]
    _write(frame, db_url, batch_id="b1")  # a replay
    assert _digest(engine) == expected


def test_results_with_an_array_of_effects_each_commit_as_the_sink_would(
    spark: Any, db_url: str, engine: Engine, second_db: tuple[str, Engine]
) -> None:
    from pyspark.sql import functions as F

    sink_url, by_sink = second_db
    for e in (engine, by_sink):
        insert_endpoint(e, "hook")
    invoices = spark.createDataFrame(invoice_rows(4), INVOICE_SCHEMA)
    effect = F.struct(
        F.sha2(F.concat(F.lit("inv:"), "invoice_id"), 256).alias("idempotency_key"),
        F.lit("hook").alias("endpoint"),
        F.to_json(F.struct("invoice_id", "amount")).alias("payload"),
        F.col("invoice_id").alias("reference"),
    )
    # One row with no invoice (NULL key) carries a reject only: an event never billed.
    orphan = invoices.limit(1).select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in invoices.schema.fields],
        F.array(
            F.struct(
                F.lit(None).cast("string").alias("idempotency_key"),
                F.lit("hook").alias("endpoint"),
                F.lit('{"event": 7}').alias("payload"),
                F.lit(None).cast("string").alias("reference"),
            )
        ).alias("effects"),
    )
    frame = invoices.withColumn("effects", F.array(effect)).unionByName(orphan)
    keys = {"results_table": "invoices", "results_keys": "invoice_id"}
    _write(frame, db_url, batch_id="b1", **keys)
    effects = frame.select(F.explode("effects").alias("e")).select("e.*")
    sink(sink_url).write(invoices, effects, batch_id="b1")
    assert _digest(engine) == _digest(by_sink)
    assert table(engine, "SELECT result_rows, effects_new, rejects FROM batches") == [(4, 4, 1)]


def test_insert_into_a_view_using_outbox_commits_one_batch_from_sql(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    spark.createDataFrame(effect_rows(3), EFFECT_SCHEMA).createOrReplaceTempView("source_rows")
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW billing_outbox USING outbox "
        f"OPTIONS (database_url '{db_url}', job 'sql', batch_id 'day-1')"
    )
    insert = (
        "INSERT INTO billing_outbox (idempotency_key, endpoint, payload, recipient) "
        "SELECT idempotency_key, endpoint, payload, recipient FROM source_rows"
    )
    spark.sql(insert)
    spark.sql(insert)  # the same batch id again: a replay
    assert table(engine, "SELECT job, batch_id, effects_new FROM batches") == [("sql", "day-1", 3)]
    assert table(engine, "SELECT count(*) FROM visible_effects")[0][0] == 3


@pytest.mark.parametrize(
    ("options", "columns", "named"),
    [
        ({}, EFFECT_SCHEMA, r"option batch_id: missing(.|\n)*add \.option\('batch_id'"),
        ({"batch_id": "b", "colour": "red"}, EFFECT_SCHEMA, r"option colour: .*no such option"),
        (
            {"batch_id": "b"},
            "idempotency_key string, endpoint string, payload struct<n: long>",
            r"column payload: is struct<n:bigint>; select to_json",
        ),
        ({"batch_id": "b"}, "idempotency_key string, endpoint string", r"column payload: missing"),
        (
            {"batch_id": "b", "on_invalid": "ignore"},
            EFFECT_SCHEMA,
            r"option on_invalid: 'ignore' is not a choice",
        ),
    ],
)
def test_a_bad_option_or_column_is_refused_naming_the_fix_before_anything_is_written(
    spark: Any, db_url: str, engine: Engine, options: dict[str, str], columns: str, named: str
) -> None:
    frame = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=named):
        _write(frame, db_url, **options)
    assert table(engine, "SELECT count(*) FROM batch_runs")[0][0] == 0


def test_overwrite_is_refused_the_outbox_only_adds(spark: Any, db_url: str) -> None:
    frame = spark.createDataFrame(effect_rows(1), EFFECT_SCHEMA)
    writer = frame.write.format("outbox").mode("overwrite").option("database_url", db_url)
    with pytest.raises(Exception, match=r"mode: overwrite(.|\n)*\.mode\('append'\)"):
        writer.option("job", "t").option("batch_id", "b").save()


def test_the_volume_guard_holds_an_outsized_batch_from_its_options(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    frame = spark.createDataFrame(effect_rows(5), EFFECT_SCHEMA)
    _write(frame, db_url, batch_id="b1", **{"volume_guard.max_effects": "3"})
    held = table(engine, "SELECT hold_state, hold_reason FROM batches")
    assert held[0][0] == "held" and "hook" in held[0][1]
    assert table(engine, "SELECT count(*) FROM claimable_effects")[0][0] == 0


def _numbers_stream(spark: Any, source: Path, checkpoint: Path, db_url: str) -> Any:
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column

    frame = spark.readStream.schema("n long, v long").option("maxFilesPerTrigger", 1)
    frame = frame.json(str(source))
    effects = frame.select(
        effect_key_column("t.stream", frame.schema, "n").alias("idempotency_key"),
        F.lit("hook").alias("endpoint"),
        F.to_json(F.struct("n", "v")).alias("payload"),
    )
    query = (
        effects.writeStream.format("outbox")
        .option("database_url", db_url)
        .option("job", "t")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    assert query.exception() is None
    return str(query.id)


@pytest.fixture
def source(engine: Engine, tmp_path: Path) -> Path:
    insert_endpoint(engine, "hook")
    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(2):
        rows = (json.dumps({"n": n, "v": 1}) for n in range(part * 5, part * 5 + 5))
        (folder / f"part{part}.json").write_text("\n".join(rows))
    return folder


MARKS = "SELECT batch_id, effects_new, effects_deduplicated, payload_mismatches FROM batches"


def test_a_stream_restarted_from_its_checkpoint_skips_the_replayed_batch(
    spark: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "cp"
    query_id = _numbers_stream(spark, source, checkpoint, db_url)
    before = (table(engine, EFFECTS_SNAPSHOT), table(engine, MARKS + " ORDER BY 1"))
    assert [m[:2] for m in before[1]] == [(f"{query_id}/0", 5), (f"{query_id}/1", 5)]
    for name in ("1", ".1.crc"):  # Spark forgets batch 1 committed: it runs it again
        os.remove(checkpoint / "commits" / name)
    assert _numbers_stream(spark, source, checkpoint, db_url) == query_id
    assert (table(engine, EFFECTS_SNAPSHOT), table(engine, MARKS + " ORDER BY 1")) == before
    assert table(engine, LEFTOVERS)[0][0] == 0


def test_a_stream_on_a_fresh_checkpoint_skips_nothing_and_counts_changed_payloads(
    spark: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    first_id = _numbers_stream(spark, source, tmp_path / "cp1", db_url)
    first = table(engine, EFFECTS_SNAPSHOT)
    (source / "part1.json").write_text(  # a corrected copy: two payloads differ
        "\n".join(json.dumps({"n": n, "v": 2 if n < 7 else 1}) for n in range(5, 10))
    )
    second_id = _numbers_stream(spark, source, tmp_path / "cp2", db_url)
    assert second_id != first_id
    markers = table(engine, MARKS + f" WHERE batch_id LIKE '{second_id}/%' ORDER BY 1")
    assert markers == [(f"{second_id}/0", 0, 5, 0), (f"{second_id}/1", 0, 5, 2)]
    assert table(engine, EFFECTS_SNAPSHOT) == first
