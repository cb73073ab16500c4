"""The example job: usage events -> per-customer per-day invoices and their effects.

Pure transformations (DataFrame -> DataFrame): no I/O, no session. The entry
point (spark_outbox.billing.run) reads, calls these, and hands the output to the sink.

Bad input is never dropped. An event that cannot be billed (negative units, no
customer, no unit price, an unreadable timestamp) is a result-level problem: it
becomes no invoice, and it goes to rejects as an effects row carrying
``reject_reason`` and the raw event. A customer without an e-mail address still
gets a valid invoice and its webhook; only the e-mail effect is rejected.
"""

from __future__ import annotations

from typing import Any

from spark_outbox.spark.keys import effect_key_column

EVENT_SCHEMA = (
    "customer_id string, event_id string, ts string, units long, unit_price string, "
    "currency string, customer_email string"
)
WEBHOOK_ENDPOINT = "billing-webhook"
EMAIL_ENDPOINT = "billing-email"


def parse_events(raw: Any) -> Any:
    """Typed events plus ``problem``: why the event cannot be billed (NULL when fine)."""
    from pyspark.sql import functions as F

    events = raw.withColumn("event_ts", F.try_to_timestamp(F.col("ts"))).withColumn(
        "price", F.col("unit_price").try_cast("decimal(18,4)")
    )
    problem = (
        F.when(F.col("customer_id").isNull(), F.lit("customer_id: missing; fix the source record"))
        .when(
            F.col("event_ts").isNull(),
            F.concat(
                F.lit("ts: "),
                F.coalesce(F.col("ts"), F.lit("NULL")),
                F.lit(" is not a timestamp; use ISO 8601 with a zone"),
            ),
        )
        .when(
            F.col("units").isNull() | (F.col("units") < 0),
            F.lit("units: missing or negative; credits are not usage events"),
        )
        .when(
            F.col("price").isNull() | (F.col("price") < 0),
            F.lit("unit_price: missing or not a non-negative decimal"),
        )
        .when(
            F.length(F.coalesce(F.col("currency"), F.lit(""))) != 3,
            F.lit("currency: not a 3-letter ISO code"),
        )
    )
    return events.withColumn("problem", problem)


def rejected_events(events: Any) -> Any:
    """Events that cannot be billed, as effects rows that the sink moves to rejects."""
    from pyspark.sql import functions as F

    raw = F.to_json(
        F.struct(
            "customer_id", "event_id", "ts", "units", "unit_price", "currency", "customer_email"
        )
    )
    return events.where(F.col("problem").isNotNull()).select(
        F.lit(None).cast("string").alias("idempotency_key"),
        F.lit(None).cast("string").alias("endpoint"),
        raw.alias("payload"),
        F.col("problem").alias("reject_reason"),
    )


def aggregate(good_events: Any, *group: Any) -> Any:
    from pyspark.sql import functions as F

    return good_events.groupBy("customer_id", "currency", *group).agg(
        F.sum(F.col("units") * F.col("price")).cast("decimal(18,4)").alias("amount"),
        F.sum("units").alias("units"),
        F.count(F.lit(1)).alias("event_count"),
        F.max("customer_email").alias("customer_email"),
    )


def daily_totals(events: Any) -> Any:
    """Batch: per customer, currency and UTC day."""
    from pyspark.sql import functions as F

    good = events.where(F.col("problem").isNull())
    return aggregate(good.withColumn("invoice_date", F.to_date("event_ts")), "invoice_date")


def invoices(totals: Any, job: str, batch_id: str) -> Any:
    """Rows of the ``invoices`` results table; the id is derived from business identity."""
    from pyspark.sql import functions as F

    key = effect_key_column("invoice", totals.schema, "customer_id", "invoice_date", "currency")
    return totals.select(
        F.concat(F.lit("inv_"), F.substring(key, 1, 24)).alias("invoice_id"),
        "customer_id",
        "invoice_date",
        "currency",
        "amount",
        "units",
        "event_count",
        "customer_email",
        F.lit(job).alias("job"),
        F.lit(batch_id).alias("batch_id"),
    )


def invoice_effects(invoice_rows: Any) -> Any:
    """Per invoice: the ``invoice.created`` webhook and the invoice e-mail."""
    from pyspark.sql import functions as F

    schema = invoice_rows.schema
    fields: list[Any] = [
        F.lit("invoice.created").alias("type"),
        "invoice_id",
        "customer_id",
        F.col("invoice_date").cast("string").alias("invoice_date"),
        "currency",
        F.col("amount").cast("string").alias("amount"),
        "units",
        "event_count",
    ]
    webhook = invoice_rows.select(
        effect_key_column(
            "invoice.created", schema, "customer_id", "invoice_date", "currency"
        ).alias("idempotency_key"),
        F.lit(WEBHOOK_ENDPOINT).alias("endpoint"),
        F.lit(None).cast("string").alias("recipient"),
        F.to_json(F.struct(*fields)).alias("payload"),
        F.col("customer_id").alias("ordering_key"),
        F.col("invoice_id").alias("reference"),
        F.lit(None).cast("string").alias("reject_reason"),
    )
    subject = F.concat(F.lit("Your invoice for "), F.col("invoice_date").cast("string"))
    body = F.concat_ws(
        "\n",
        F.concat(F.lit("Invoice "), F.col("invoice_id")),
        F.concat(F.lit("Date: "), F.col("invoice_date").cast("string")),
        F.concat(F.lit("Usage: "), F.col("units").cast("string"), F.lit(" units")),
        F.concat(
            F.lit("Amount due: "), F.col("amount").cast("string"), F.lit(" "), F.col("currency")
        ),
    )
    email = invoice_rows.select(
        effect_key_column("invoice.email", schema, "customer_id", "invoice_date", "currency").alias(
            "idempotency_key"
        ),
        F.lit(EMAIL_ENDPOINT).alias("endpoint"),
        F.col("customer_email").alias("recipient"),
        F.to_json(F.struct(subject.alias("subject"), body.alias("text"), *fields)).alias("payload"),
        F.col("customer_id").alias("ordering_key"),
        F.col("invoice_id").alias("reference"),
        F.when(
            F.col("customer_email").isNull(),
            F.concat(
                F.lit("recipient: customer "),
                F.col("customer_id"),
                F.lit(" has no e-mail address; add one and re-run the day"),
            ),
        ).alias("reject_reason"),
    )
    return webhook.unionByName(email)
