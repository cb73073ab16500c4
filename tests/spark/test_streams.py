"""Stream batch identity with real streaming queries: no silent skips.

A micro-batch's id is ``<query id>/<n>``, the query id being the one Spark keeps
in the checkpoint. Restarting from the same checkpoint replays batch ids (the
sink skips them: nothing doubled); a fresh checkpoint over the same input gets
new ids (nothing skipped; the same keys deduplicate; changed payloads counted).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core.errors import ConfigurationError
from tests.conftest import insert_endpoint
from tests.spark.helpers import EFFECTS_SNAPSHOT, numbers_query, sink, table

pytestmark = pytest.mark.spark
MARKERS = "SELECT batch_id, effects_new, effects_deduplicated, payload_mismatches FROM batches"


@pytest.fixture
def source(engine: Engine, tmp_path: Path) -> Path:
    insert_endpoint(engine, "hook")
    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(2):
        numbers = range(part * 5, part * 5 + 5)
        rows = (json.dumps({"n": n, "v": 1}) for n in numbers)
        (folder / f"part{part}.json").write_text("\n".join(rows))
    return folder


def _run(spark: Any, source: Path, checkpoint: Path, db_url: str) -> str:
    query = numbers_query(spark, source, checkpoint, sink(db_url, results=None))
    assert query.awaitTermination(180)
    assert query.exception() is None
    return str(query.id)


def test_foreach_batch_outside_a_streaming_query_refuses_before_writing(
    spark: Any, db_url: str, engine: Engine
) -> None:
    run = sink(db_url, results=None).foreach_batch(lambda df, batch_id: (None, df))
    frame = spark.createDataFrame([(1,)], "n long")
    with pytest.raises(ConfigurationError, match=r"no stream identity(.|\n)*checkpoint="):
        run(frame, 0)
    assert table(engine, "SELECT count(*) FROM batch_runs")[0][0] == 0


def test_restart_from_the_same_checkpoint_skips_the_replayed_batch_and_doubles_nothing(
    spark: Any,
    db_url: str,
    engine: Engine,
    source: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    checkpoint = tmp_path / "cp"
    query_id = _run(spark, source, checkpoint, db_url)
    before = (table(engine, EFFECTS_SNAPSHOT), table(engine, MARKERS + " ORDER BY 1"))
    assert [m[:2] for m in before[1]] == [(f"{query_id}/0", 5), (f"{query_id}/1", 5)]
    # Spark forgets that batch 1 committed: on restart it runs batch 1 again.
    for name in ("1", ".1.crc"):
        os.remove(checkpoint / "commits" / name)
    with caplog.at_level(logging.INFO, logger="spark_outbox.spark.sink"):
        assert _run(spark, source, checkpoint, db_url) == query_id
    replays = [r for r in caplog.records if getattr(r, "event", "") == "batch.replayed"]
    assert [r.batch_id for r in replays] == [f"{query_id}/1"]
    assert replays[0].original["effects_new"] == 5 and replays[0].effects_new == 0
    assert (table(engine, EFFECTS_SNAPSHOT), table(engine, MARKERS + " ORDER BY 1")) == before


def test_a_fresh_checkpoint_skips_nothing_same_keys_dedupe_and_changes_are_counted(
    spark: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    first_id = _run(spark, source, tmp_path / "cp1", db_url)
    first = table(engine, EFFECTS_SNAPSHOT)
    (source / "part1.json").write_text(  # a corrected copy: two payloads differ
        "\n".join(json.dumps({"n": n, "v": 2 if n < 7 else 1}) for n in range(5, 10))
    )
    second_id = _run(spark, source, tmp_path / "cp2", db_url)
    assert second_id != first_id
    markers = table(engine, MARKERS + f" WHERE batch_id LIKE '{second_id}/%' ORDER BY 1")
    assert markers == [(f"{second_id}/0", 0, 5, 0), (f"{second_id}/1", 0, 5, 2)]
    assert table(engine, EFFECTS_SNAPSHOT) == first  # the first payloads won


def test_checkpoint_argument_names_the_same_batch_ids_as_the_query_id(
    spark: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "cp"
    query = numbers_query(
        spark, source, checkpoint, sink(db_url, results=None), checkpoint_argument=True
    )
    assert query.awaitTermination(180) and query.exception() is None
    ids = [r[0] for r in table(engine, "SELECT batch_id FROM batches ORDER BY 1")]
    assert ids == [f"{query.id}/0", f"{query.id}/1"]


def test_a_replayed_micro_batch_of_a_stateful_query_is_computed_and_the_query_goes_on(
    spark: Any, db_url: str, engine: Engine, source: Path, tmp_path: Path
) -> None:
    """The driver died after the sink committed a micro-batch, before Spark logged it:
    Spark replays it, the sink writes nothing, and the query's state stores must still
    commit (Spark refuses a micro-batch whose stateful partitions did not all run)."""
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column

    checkpoint = tmp_path / "cp"

    def derive(batch: Any, batch_id: str) -> tuple[Any, Any]:
        return None, batch.select(
            effect_key_column("t.count", batch.schema, "n").alias("idempotency_key"),
            F.lit("hook").alias("endpoint"),
            F.to_json(F.struct("n", "count")).alias("payload"),
        )

    def run_counts() -> None:
        query = (
            spark.readStream.schema("n long, v long")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .groupBy("n")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(sink(db_url, results=None).foreach_batch(derive))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)  # raises if a micro-batch failed
        assert query.exception() is None

    run_counts()
    before = table(engine, MARKERS)
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for logged in (commits / str(last), commits / f".{last}.crc"):
        logged.unlink(missing_ok=True)
    run_counts()
    assert len(before) == 2 and table(engine, MARKERS) == before
    assert (commits / str(last)).exists()  # Spark logged the replayed batch this time
