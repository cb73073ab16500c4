"""The Spark key expression and ``spark_outbox.core.keys.effect_key`` agree byte for byte."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.keys import effect_key, encode_parts
from spark_outbox.spark.keys import effect_key_column, encoded_parts_column

pytestmark = pytest.mark.spark

SCHEMA = (
    "s string, l long, i int, b boolean, n0 decimal(38,0), n4 decimal(18,4), "
    "n10 decimal(38,10), d date, t timestamp, x binary"
)
SCALES = {"n0": 0, "n4": 4, "n10": 10}


def _decimal(digits: int, scale: int) -> st.SearchStrategy[Decimal | None]:
    bound = 10 ** (digits - scale) - 1
    return st.none() | st.decimals(
        min_value=-bound, max_value=bound, places=scale, allow_nan=False, allow_infinity=False
    )


ZONES = st.sampled_from(
    [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-11))]
)
TRICKY_TEXT = st.text(alphabet="|\\:,;sSnN0é€😀\u2028 ", max_size=8) | st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12
)
ROW = st.tuples(
    st.none() | TRICKY_TEXT,
    st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.none() | st.booleans(),
    _decimal(38, 0)
    | st.sampled_from([Decimal("-" + "9" * 38), Decimal("365699520246519039122453213216768")]),
    _decimal(18, 4) | st.sampled_from([Decimal("1.1000"), Decimal("-0.0000"), Decimal("0.0001")]),
    _decimal(38, 10) | st.sampled_from([Decimal("1E-10"), Decimal("-1E-10"), Decimal("1E+20")]),
    st.none() | st.dates(min_value=dt.date(1700, 1, 1), max_value=dt.date(2500, 12, 31)),
    st.none()
    | st.datetimes(
        min_value=dt.datetime(1900, 1, 2), max_value=dt.datetime(2300, 1, 1), timezones=ZONES
    ),
    st.none() | st.binary(max_size=8),
)


def _python_encoding(row: tuple[Any, ...]) -> str:
    parts = list(row)
    with decimal.localcontext(prec=80):
        for index, name in enumerate(("n0", "n4", "n10"), start=4):
            if parts[index] is not None:  # what the decimal(p, s) column holds
                parts[index] = parts[index].quantize(Decimal(1).scaleb(-SCALES[name]))
    return encode_parts("ns.test", *parts)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(ROW, min_size=1, max_size=25))
def test_spark_and_python_keys_agree(spark: Any, rows: list[tuple[Any, ...]]) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, *r) for i, r in enumerate(rows)], "idx int, " + SCHEMA)
    columns = [c for c in df.columns if c != "idx"]
    keyed = df.select(
        "idx",
        encoded_parts_column("ns.test", df.schema, *columns).alias("encoded"),
        effect_key_column("ns.test", df.schema, *columns).alias("key"),
    )
    for got in keyed.orderBy(F.col("idx")).collect():
        expected = _python_encoding(rows[got["idx"]])
        assert (got["encoded"], rows[got["idx"]]) == (expected, rows[got["idx"]])
        assert got["key"] == hashlib.sha256(expected.encode("ascii")).hexdigest()


def test_decimals_keep_all_38_digits() -> None:
    # Regression: Decimal.normalize() rounded to 28 digits, so these collided.
    big = Decimal("365699520246519039122453213216768")
    assert effect_key("ns", big) != effect_key("ns", big + 1)


def test_no_parts_and_single_parts_agree(spark: Any) -> None:
    df = spark.createDataFrame([("a|b", None)], "s string, e string")
    row = df.select(
        effect_key_column("ns", df.schema).alias("k0"),
        effect_key_column("ns", df.schema, "s", "e").alias("k2"),
    ).first()
    assert row["k0"] == effect_key("ns")
    assert row["k2"] == effect_key("ns", "a|b", None)


@pytest.mark.parametrize("spark_type", ["double", "float", "timestamp_ntz"])
def test_columns_without_a_stable_encoding_are_refused(spark: Any, spark_type: str) -> None:
    df = spark.createDataFrame([], f"v {spark_type}")
    with pytest.raises(InvalidEffect, match=r"v: .*(not business identity|names no instant)"):
        effect_key_column("ns", df.schema, "v")
