"""The effects column contract, applied to a DataFrame before it is staged.

Required: ``idempotency_key`` (64 hex), ``endpoint`` (a registered name),
``payload`` (a JSON object, as text or as a struct/map column). Optional:
``recipient``, ``ordering_key``, ``reference`` (a business reference such as an
invoice number, at most 200 characters), ``supersedes`` (the key of the effect
a correction replaces: spark_outbox.spark.keys.supersedes_column), ``not_before`` (timestamp), and
``reject_reason``: a job that already knows a row is bad (an input event it
cannot bill) sets it, and the row goes to rejects with that reason, counted on
the batch marker, in the same commit. Missing required columns are a mistake in
the job, refused before anything runs; bad values are per-row rejects.
"""

from __future__ import annotations

from typing import Any

from spark_outbox.core.errors import ConfigurationError

REQUIRED = ("idempotency_key", "endpoint", "payload")
OPTIONAL_TEXT = ("recipient", "ordering_key", "reference", "supersedes", "reject_reason")
OPTIONAL_TIMES = ("not_before",)
# Every column of the contract, in the order the executors receive them.
COLUMNS = (*REQUIRED, *OPTIONAL_TEXT, *OPTIONAL_TIMES)
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "ignoreNullFields": "false"}


def effect_frame(df: Any) -> Any:
    """``df`` reduced to the contract's columns, typed as the executors expect."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigurationError(
            f"effects DataFrame lacks required column(s) {missing} (has {df.columns}); "
            "add them: idempotency_key (spark_outbox.spark.keys.effect_key_column), "
            "endpoint, payload"
        )
    payload_type = df.schema["payload"].dataType
    payload = (
        F.to_json(F.col("payload"), JSON_OPTIONS)
        if isinstance(payload_type, T.StructType | T.MapType)
        else F.col("payload").cast("string")
    )
    columns = [
        F.col("idempotency_key").cast("string").alias("idempotency_key"),
        F.col("endpoint").cast("string").alias("endpoint"),
        payload.alias("payload"),
    ]
    for name in OPTIONAL_TEXT:
        value = F.col(name).cast("string") if name in df.columns else F.lit(None).cast("string")
        columns.append(value.alias(name))
    for name in OPTIONAL_TIMES:
        value = F.col(name) if name in df.columns else F.lit(None)
        columns.append(value.cast("timestamp").alias(name))
    return df.select(*columns)


def result_frame(df: Any) -> Any:
    """One JSON text column ``row`` per result row, applied by jsonb_populate_record."""
    from pyspark.sql import functions as F

    return df.select(F.to_json(F.struct(*df.columns), JSON_OPTIONS).alias("row"))
