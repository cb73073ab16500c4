"""The effects column contract, applied to a DataFrame before it is staged.

Required: ``idempotency_key`` (64 hex), ``endpoint`` (a registered name),
``payload`` (a JSON object, as text or as a struct/map column). Optional:
``recipient``, ``ordering_key``, ``reference`` (a business reference such as an
invoice number, at most 200 characters), ``supersedes`` (the key of the effect
a correction replaces: spark_outbox.spark.keys.supersedes_column), ``not_before`` (timestamp),
``expires_at`` (the send-by time: a time column, never text, since a text the
job meant as a time but that does not parse must never become "no send-by
time"; after it the effect is never sent and ends 'expired'), and
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
OPTIONAL_TIMES = ("not_before", "expires_at")
# Time columns refused unless they hold times (the others are cast, as ever).
STRICT_TIMES = ("expires_at",)
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
        if name in df.columns and name in STRICT_TIMES:
            _check_time_type(df, name)
        value = F.col(name) if name in df.columns else F.lit(None)
        columns.append(value.cast("timestamp").alias(name))
    return df.select(*columns)


def _check_time_type(df: Any, name: str) -> None:
    """A send-by column holds times (timestamp; timestamp_ntz and date are read in
    the session's time zone, as the data source reads them), never text: a text the
    job meant as a time that did not parse would become "no send-by time"."""
    from pyspark.sql import types as T

    found = df.schema[name].dataType
    if not isinstance(found, T.TimestampType | T.TimestampNTZType | T.DateType):
        raise ConfigurationError(
            f"effects column {name} is {found.simpleString()}, not a timestamp; make it one "
            f"explicitly, e.g. F.to_timestamp(F.col('{name}'), \"yyyy-MM-dd'T'HH:mm:ssXXX\")"
        )


def result_frame(df: Any) -> Any:
    """One JSON text column ``row`` per result row, applied by jsonb_populate_record."""
    from pyspark.sql import functions as F

    return df.select(F.to_json(F.struct(*df.columns), JSON_OPTIONS).alias("row"))
