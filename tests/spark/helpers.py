"""Small builders shared by the Spark tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.keys import effect_key
from spark_outbox.spark.results import ResultsSpec
from spark_outbox.spark.sink import OutboxSink

# What executors receive: the effects contract's columns as Arrow types.
EFFECT_ARROW_SCHEMA = pa.schema(
    [
        ("idempotency_key", pa.string()),
        ("endpoint", pa.string()),
        ("payload", pa.string()),
        ("recipient", pa.string()),
        ("ordering_key", pa.string()),
        ("reference", pa.string()),
        ("supersedes", pa.string()),
        ("reject_reason", pa.string()),
        ("not_before", pa.timestamp("us", tz="UTC")),
        ("expires_at", pa.timestamp("us", tz="UTC")),
    ]
)
EFFECT_SCHEMA = "idempotency_key string, endpoint string, payload string, recipient string"
INVOICE_SCHEMA = (
    "invoice_id string, customer_id string, invoice_date date, currency string, "
    "amount decimal(18,4), units long, event_count long, customer_email string, "
    "job string, batch_id string"
)
INVOICES = ResultsSpec("invoices", ("invoice_id",))


def effect_rows(n: int, *, endpoint: str = "hook", version: int = 1) -> list[tuple[Any, ...]]:
    return [
        (effect_key("test.effect", i), endpoint, json.dumps({"n": i, "v": version}), f"r{i}")
        for i in range(n)
    ]


def invoice_rows(n: int, job: str = "t", batch_id: str = "b1") -> list[tuple[Any, ...]]:
    import datetime as dt
    from decimal import Decimal

    return [
        (f"inv{i}", f"c{i}", dt.date(2026, 1, 1), "EUR", Decimal(i) / 4, i, 1, None, job, batch_id)
        for i in range(n)
    ]


def sink(db_url: str, **overrides: Any) -> OutboxSink:
    return OutboxSink(**{"job": "t", "database_url": db_url, "results": INVOICES, **overrides})


def table(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def marker(engine: Engine, batch_id: str, job: str = "t") -> dict[str, Any]:
    with engine.connect() as conn:
        row = (
            conn.execute(
                sa.text("SELECT * FROM batches WHERE job = :j AND batch_id = :b"),
                {"j": job, "b": batch_id},
            )
            .mappings()
            .one()
        )
    return dict(row)


EFFECTS_SNAPSHOT = (
    "SELECT idempotency_key, job, batch_id, endpoint, recipient, payload::text, payload_sha256, "
    "state FROM effects ORDER BY idempotency_key"
)
INVOICES_SNAPSHOT = (
    "SELECT invoice_id, customer_id, invoice_date, currency, amount, units, event_count, "
    "customer_email FROM invoices ORDER BY invoice_id"
)

LEFTOVERS = (
    "SELECT (SELECT count(*) FROM staged_rejects) + (SELECT count(*) FROM staged_results) "
    "+ (SELECT count(*) FROM deferred_effects) + (SELECT count(*) FROM batch_runs)"
)
REJECTS_SNAPSHOT = "SELECT job, batch_id, reason, raw_row::text FROM rejects ORDER BY 1, 2, 3, 4"


def run_state(engine: Engine, *, stream: bool = False) -> tuple[Any, ...]:
    """What a run leaves, to compare with one clean run: results, effects (keys, payload
    hashes, states), rejects, and staging left over (none)."""
    effects = table(engine, EFFECTS_SNAPSHOT)
    rejects = table(engine, REJECTS_SNAPSHOT)
    if stream:  # batch ids carry the checkpoint's query id: compare the rest
        effects = [(*r[:2], *r[3:]) for r in effects]
        rejects = sorted((r[0], *r[2:]) for r in rejects)
    return (
        table(engine, INVOICES_SNAPSHOT),
        effects,
        rejects,
        table(engine, LEFTOVERS)[0][0],
    )


def numbers_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    stream_sink: Any,
    *,
    checkpoint_argument: bool = False,
) -> Any:
    """A streaming query over JSON files of ``{"n": .., "v": ..}``: one effect per n, one
    file per micro-batch; the payload carries v, so a changed v is a changed payload."""
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column

    def derive(batch: Any, batch_id: str) -> tuple[Any, Any]:
        effects = batch.select(
            effect_key_column("t.stream", batch.schema, "n").alias("idempotency_key"),
            F.lit("hook").alias("endpoint"),
            F.to_json(F.struct("n", "v")).alias("payload"),
        )
        return None, effects

    foreach = stream_sink.foreach_batch(
        derive, checkpoint=checkpoint if checkpoint_argument else None
    )
    return (
        spark.readStream.schema("n long, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(foreach)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
