"""Entry points of the billing job: read, transform (spark_outbox.billing.job), hand to the sink.

Batch mode: one file of one day (``events-<date>.json``), batch id = the date.
Stream mode: a file source over the directory, one file per micro-batch,
checkpointed; invoices are closed by an event-time watermark (append mode), so
each invoice is emitted once, final. Events that cannot be billed go through a
second query to rejects. Known limit: Spark drops events later than the
watermark; the watermark delay (``--watermark``) is how late data may arrive.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from spark_outbox.billing import job as billing
from spark_outbox.spark.results import ResultsSpec
from spark_outbox.spark.sink import OutboxSink

# Each invoice carries the job and batch that wrote it: reconciliation can then tell
# rows a batch did not write from its own (ResultsSpec.batch_columns).
INVOICES = ResultsSpec("invoices", ("invoice_id",), batch_columns=("job", "batch_id"))
BATCH_JOB = "billing"
STREAM_JOB = "billing.stream"


def batch_input(input_dir: Path, date: str) -> Path:
    """The file batch mode bills for ``date`` (YYYY-MM-DD): one file per UTC day."""
    return input_dir / f"events-{date}.json"


def batch_sink(database_url: str, **options: Any) -> OutboxSink:
    return OutboxSink(job=BATCH_JOB, database_url=database_url, results=INVOICES, **options)


def run_batch(
    spark: Any,
    input_dir: Path,
    date: str,
    database_url: str,
    *,
    dry_run: bool = False,
    **sink_options: Any,
) -> dict[str, Any]:
    """Bill one day; re-running the same date is a replay and writes nothing.

    ``dry_run``: compute the day in full and preview it (``OutboxSink.preview``),
    also for a date committed before; nothing is written.
    """
    from pyspark.sql import functions as F

    sink = batch_sink(database_url, **sink_options)
    replayed = None if dry_run else sink.replayed(date)
    if replayed is not None:  # committed before: skip without reading anything
        return dataclasses.asdict(replayed)
    path = batch_input(input_dir, date)
    raw = spark.read.schema(billing.EVENT_SCHEMA).json(str(path)).persist()
    try:
        events = billing.parse_events(raw)
        # An event of another day in this day's file is rejected, not billed twice.
        events = events.withColumn(
            "problem",
            F.when(
                F.col("problem").isNull() & (F.to_date("event_ts") != F.lit(date).cast("date")),
                F.lit(f"ts: not on {date}, the day this file bills"),
            ).otherwise(F.col("problem")),
        )
        results = billing.invoices(billing.daily_totals(events), BATCH_JOB, date).persist()
        effects = billing.invoice_effects(results).unionByName(
            billing.rejected_events(events), allowMissingColumns=True
        )
        if dry_run:
            outcome: Any = sink.preview(results, effects, batch_id=date)
        else:
            outcome = sink.write(results, effects, batch_id=date)
        results.unpersist()
    finally:
        raw.unpersist()
    return dataclasses.asdict(outcome)


def start_stream(
    spark: Any,
    input_dir: Path,
    checkpoint: Path,
    database_url: str,
    *,
    available_now: bool,
    watermark: str = "1 hour",
    **sink_options: Any,
) -> list[Any]:
    """Start the invoices query and the rejects query; return them (the caller awaits)."""
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.schema(billing.EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
    )
    events = billing.parse_events(raw)
    good = events.where(F.col("problem").isNull()).withWatermark("event_ts", watermark)
    totals = billing.aggregate(good, F.window("event_ts", "1 day")).select(
        "*", F.to_date(F.col("window.start")).alias("invoice_date")
    )
    invoices_sink = OutboxSink(
        job=STREAM_JOB, database_url=database_url, results=INVOICES, **sink_options
    )
    rejects_sink = OutboxSink(
        job=STREAM_JOB + ".rejects", database_url=database_url, **sink_options
    )

    def derive_invoices(batch: Any, batch_id: str) -> tuple[Any, Any]:
        results = billing.invoices(batch.drop("window"), STREAM_JOB, batch_id)
        return results, billing.invoice_effects(results)

    def derive_rejects(batch: Any, batch_id: str) -> tuple[Any, Any]:
        return None, billing.rejected_events(batch)

    queries = []
    for name, frame, derive, sink, mode in (
        ("invoices", totals, derive_invoices, invoices_sink, "append"),
        (
            "rejects",
            events.where(F.col("problem").isNotNull()),
            derive_rejects,
            rejects_sink,
            "append",
        ),
    ):
        writer = (
            frame.writeStream.outputMode(mode)
            .option("checkpointLocation", str(checkpoint / name))
            # The query id from the checkpoint: the one way that works under Spark
            # Connect too, where foreachBatch runs on the server (spark.streams).
            .foreachBatch(sink.foreach_batch(derive, checkpoint=checkpoint / name))
        )
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime="2 seconds")
        )
        queries.append(writer.queryName(f"billing-{name}").start())
    return queries
