"""Idempotency keys as a Spark column expression, byte-identical to ``spark_outbox.core.keys``.

Built from Spark's built-in functions only (no Python UDF: keys are on the hot
path). Each part is encoded by its column's data type, exactly as
``spark_outbox.core.keys.encode_part`` encodes the Python value Spark would hand back:

=================================  ==========================================
Spark type                         encoding
=================================  ==========================================
string                             ``s`` + upper hex of the UTF-8 bytes
byte/short/int/long                ``i`` + decimal
boolean                            ``b1`` / ``b0``
decimal(p, s)                      ``n`` + plain digits, trailing zeros cut
date                               ``d`` + ``unix_date``
timestamp (an instant)             ``t`` + ``unix_micros``
binary                             ``x`` + upper hex
NULL of any type                   ``N``
=================================  ==========================================

Refused when the expression is built: float/double (Python keys them by
``float.hex()``, which no built-in reproduces; floats are not business identity
anyway), ``timestamp_ntz`` (no time zone: it names no instant), and nested types.
A property test (tests/spark/test_keys_agree.py) proves the agreement.

``revision``: an int, or the name of an integer column (per row: NULL means 1);
a revision >= 2 appends ``|r<n>`` as ``spark_outbox.core.keys`` does; a revision
below 1 gives a NULL key, which the contract rejects with its reason.
``supersedes_column`` is the key of ``revision - 1`` (NULL for the original).
"""

from __future__ import annotations

from typing import Any

from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.keys import KEY_VERSION, REVISION_TAG, SEPARATOR, check_revision, encode_part

Revision = int | str  # a number, or the name of an integer column


def effect_key_column(namespace: str, schema: Any, *columns: str, revision: Revision = 1) -> Any:
    """A Column of 64-hex keys of ``(namespace, *columns)``, as ``effect_key`` would give.

    ``schema`` is the DataFrame's StructType: each column's type picks its
    encoding. Constants belong in the namespace (``"invoice.created"``).
    """
    from pyspark.sql import functions as F

    return F.sha2(encoded_parts_column(namespace, schema, *columns, revision=revision), 256)


def supersedes_column(namespace: str, schema: Any, *columns: str, revision: Revision) -> Any:
    """The key the row's revision corrects (revision - 1); NULL for revision 1."""
    from pyspark.sql import functions as F

    number = _revision(schema, revision)
    earlier = F.sha2(_with_revision(_parts(namespace, schema, columns), number - 1), 256)
    return F.when(number > 1, earlier)


def encoded_parts_column(namespace: str, schema: Any, *columns: str, revision: Revision = 1) -> Any:
    """The string that is hashed, as ``spark_outbox.core.keys.encode_parts`` builds it."""
    parts = _parts(namespace, schema, columns)
    if revision == 1:
        return parts
    return _with_revision(parts, _revision(schema, revision))


def _revision(schema: Any, revision: Revision) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(revision, str):
        if revision not in schema.fieldNames() or not isinstance(
            schema[revision].dataType, T.ByteType | T.ShortType | T.IntegerType | T.LongType
        ):
            raise InvalidEffect(
                "revision", f"{revision!r} is not an integer column", "name an int column"
            )
        return F.coalesce(F.col(revision).cast("long"), F.lit(1))
    return F.lit(check_revision(revision))


def _with_revision(parts: Any, number: Any) -> Any:
    """``parts`` for revision 1, ``parts|r<n>`` above; NULL (a reject) below 1."""
    from pyspark.sql import functions as F

    suffix = F.concat(F.lit(SEPARATOR + REVISION_TAG), number.cast("string"))
    return F.when(number == 1, parts).when(number > 1, F.concat(parts, suffix))


def _parts(namespace: str, schema: Any, columns: tuple[str, ...]) -> Any:
    from pyspark.sql import functions as F

    if not isinstance(namespace, str) or not namespace:
        raise ValueError("namespace: must be a non-empty string, e.g. 'invoice.created'")
    encoded = [F.lit(KEY_VERSION), F.lit(encode_part(namespace))]
    for name in columns:
        if name not in schema.fieldNames():
            raise InvalidEffect(
                "key part", f"{name!r} is not a column", f"use one of {schema.fieldNames()}"
            )
        encoded.append(encode_column(F.col(name), schema[name].dataType, name))
    return F.concat_ws(SEPARATOR, *encoded)


def encode_column(col: Any, data_type: Any, name: str = "key part") -> Any:
    """``<tag><body>`` of one typed column, ``N`` for NULL."""
    from pyspark.sql import functions as F

    body = _typed_body(col, data_type, name)
    return F.when(col.isNull(), F.lit("N")).otherwise(body)


def _typed_body(col: Any, data_type: Any, name: str) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(data_type, T.StringType):
        return F.concat(F.lit("s"), F.hex(F.encode(col, "UTF-8")))
    if isinstance(data_type, T.BooleanType):
        return F.when(col, F.lit("b1")).otherwise(F.lit("b0"))
    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return F.concat(F.lit("i"), col.cast("string"))
    if isinstance(data_type, T.DecimalType):
        return F.concat(F.lit("n"), _plain_decimal(col, data_type))
    if isinstance(data_type, T.DateType):
        return F.concat(F.lit("d"), F.unix_date(col).cast("string"))
    if isinstance(data_type, T.TimestampType):
        return F.concat(F.lit("t"), F.unix_micros(col).cast("string"))
    if isinstance(data_type, T.BinaryType):
        return F.concat(F.lit("x"), F.hex(col))
    if isinstance(data_type, T.FloatType | T.DoubleType):
        raise InvalidEffect(
            name,
            f"is a {data_type.simpleString()} column: floats are not business identity",
            "cast to decimal(p,s) or string",
        )
    if isinstance(data_type, T.TimestampNTZType):
        raise InvalidEffect(
            name,
            "is a timestamp_ntz column: without a time zone it names no instant",
            "convert it with to_utc_timestamp(col, zone) or cast it to timestamp",
        )
    raise InvalidEffect(
        name,
        f"has type {data_type.simpleString()}, which keys do not support",
        "use string, integer, decimal, boolean, binary, date or timestamp columns",
    )


def _plain_decimal(col: Any, data_type: Any) -> Any:
    """Spark prints decimals plain with all ``scale`` digits; cut trailing zeros, -0 -> 0."""
    from pyspark.sql import functions as F

    text = col.cast("string")
    if data_type.scale > 0:
        text = F.regexp_replace(text, r"\.?0+$", "")
    return F.when(col == F.lit(0), F.lit("0")).otherwise(text)
