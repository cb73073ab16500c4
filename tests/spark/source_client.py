"""A driver process writing with ``format("outbox")``, for the kill tests.

    python -m tests.spark.source_client batch INPUT --date D [--date D ...]
    python -m tests.spark.source_client stream INPUT --checkpoint CP

INPUT holds ``numbers-<date>.json`` files of ``{"n": .., "v": ..}`` lines. Each
number is an invoice (``invoices``) carrying its webhook effect in ``effects``;
a negative number is an event that becomes no invoice, only a reject. Batch
mode writes each date as batch ``<date>``; stream mode reads the files one per
micro-batch. The database is ``DATABASE_URL``; the master ``local[2,3]`` (a
killed Python worker's task is tried again). Phases print as
``OUTBOX_SPARK_PHASES`` asks, from the Python workers that run the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

MASTER = "local[2,3]"
SCHEMA = "n long, v long"
OPTIONS = {"job": "src", "results_table": "invoices", "results_keys": "invoice_id"}


def shaped(frame: Any) -> Any:
    """Invoices with an array of effects; a negative n: no invoice, a reject only."""
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column

    good = F.col("n") >= 0
    effect = F.struct(
        F.when(good, effect_key_column("src", frame.schema, "n")).alias("idempotency_key"),
        F.lit("hook").alias("endpoint"),
        F.to_json(F.struct("n", "v")).alias("payload"),
        F.when(~good, F.lit("n: negative; fix the source")).alias("reject_reason"),
    )

    def invoice(name: str, value: Any) -> Any:
        return F.when(good, value).alias(name)

    return frame.select(
        invoice("invoice_id", F.concat(F.lit("inv"), F.col("n").cast("string"))),
        invoice("customer_id", F.lit("c1")),
        invoice("invoice_date", F.lit("2026-01-01").cast("date")),
        invoice("currency", F.lit("EUR")),
        invoice("amount", (F.col("v") / 4).cast("decimal(18,4)")),
        invoice("units", F.col("n")),
        invoice("event_count", F.lit(1).cast("long")),
        invoice("job", F.lit("src")),
        invoice("batch_id", F.lit("b")),
        F.array(effect).alias("effects"),
    )


def write_batches(spark: Any, folder: Path, dates: list[str], options: dict[str, str]) -> None:
    for date in dates:
        frame = spark.read.schema(SCHEMA).json(str(folder / f"numbers-{date}.json"))
        writer = shaped(frame).write.format("outbox").mode("append").options(**options)
        writer.option("batch_id", date).save()
        print(json.dumps({"written": date}), flush=True)


def run_stream(spark: Any, folder: Path, checkpoint: Path, options: dict[str, str]) -> str:
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
    query = (
        shaped(stream.json(str(folder)))
        .writeStream.format("outbox")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return str(query.id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["batch", "stream"])
    parser.add_argument("input", type=Path)
    parser.add_argument("--date", action="append", default=[])
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark_outbox.billing.session import build_session
    from spark_outbox.spark.source import register

    spark = build_session("source-client", MASTER)
    register(spark)
    options = {**OPTIONS, "database_url": os.environ["DATABASE_URL"]}
    try:
        if args.mode == "batch":
            write_batches(spark, args.input, args.date, options)
        else:
            query_id = run_stream(spark, args.input, args.checkpoint, options)
            print(json.dumps({"stream": query_id}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
