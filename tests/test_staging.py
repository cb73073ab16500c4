"""Executor staging without Spark: the vectorised checks agree with the per-row ones.

``staged_effects`` clears plain rows with Arrow compute functions and sends only
the rest through ``_check``, the per-row contract check that ``enqueue`` shares.
The property test below says the shortcut never changes an outcome: every row
gets exactly the reason, the canonical payload and the hash the per-row check
gives. The round-trip test sends awkward text through the Arrow CSV writer and
COPY into the real staging table and reads it back unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from dispatcher.keys import effect_key
from dispatcher.validation import MAX_ORDERING_KEY_CHARS, MAX_RECIPIENT_CHARS, payload_sha256
from spark_jobs.executor import _check, _raw_json, stage, staged_effects
from tests.spark.helpers import EFFECT_ARROW_SCHEMA

ATTEMPT = "00000000-0000-0000-0000-0000000000aa"

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
payloads = st.one_of(
    st.dictionaries(texts, json_values, max_size=4).map(json.dumps),
    st.dictionaries(texts, json_values, max_size=3).map(lambda d: json.dumps(d, indent=1)),
    st.sampled_from(
        [
            None,
            "",
            "{not json",
            "[1, 2]",
            '"text"',
            "7",
            '{"a": NaN}',
            '{"a": "\\u0000"}',
            '{"a": "\\\\u0000"}',
            '{"a": "\\ud800"}',
            '{"big": 123456789012345678901234567890}',
            '{"e": 1e400}',
            '{"k": 1, "k": 2}',
            json.dumps({"big": "x" * 300_000}),
        ]
    ),
)
keys = st.one_of(
    st.integers(0, 10**6).map(lambda i: effect_key("t", i)),
    st.sampled_from([None, "", "not-a-key", "A" * 64, effect_key("t", 1).upper(), "0" * 63]),
)
endpoints = st.sampled_from([None, "", "   ", "\u00a0", "\u2003x", " hook", "hook", "a\x00b"])
optional_texts = st.one_of(
    st.none(),
    texts,
    st.just("r\x00"),
    st.just("x" * (MAX_RECIPIENT_CHARS + 1)),
    st.just("y" * (MAX_ORDERING_KEY_CHARS + 1)),
)
rows = st.fixed_dictionaries(
    {
        "idempotency_key": keys,
        "endpoint": endpoints,
        "payload": payloads,
        "recipient": optional_texts,
        "ordering_key": optional_texts,
        "reject_reason": st.one_of(st.none(), st.just("declared by the job")),
        "not_before": st.one_of(
            st.none(), st.just(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
        ),
    }
)


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    reason, data = _check(row)
    if reason is not None:
        return {"reject_reason": reason, "raw_row": json.loads(_raw_json(row)), "payload": None}
    assert data is not None
    return {
        "reject_reason": None,
        "raw_row": None,
        "payload": data.decode("utf-8"),
        "payload_sha256": payload_sha256(data),
        "idempotency_key": row["idempotency_key"],
        "endpoint": row["endpoint"],
        "recipient": row["recipient"],
        "ordering_key": row["ordering_key"],
        "not_before": row["not_before"],
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows, min_size=1, max_size=8))
def test_vectorised_staging_gives_the_per_row_outcome(batch_rows: list[dict[str, Any]]) -> None:
    batch = pa.RecordBatch.from_pylist(batch_rows, schema=EFFECT_ARROW_SCHEMA)
    staged = staged_effects(batch).to_pylist()
    assert len(staged) == len(batch_rows)
    for row, got in zip(batch_rows, staged, strict=True):
        want = _expected(row)
        if got["raw_row"] is not None:
            got["raw_row"] = json.loads(got["raw_row"])
        assert {k: got[k] for k in want} == want
        if want["reject_reason"] is not None:
            assert got["idempotency_key"] is None and got["payload_sha256"] is None


def test_staged_text_survives_csv_and_copy(engine: Engine) -> None:
    awkward = ["a,b", 'quote " inside', "new\nline", "tab\there", "", "ünïcödé ✓", "back\\slash"]
    batch_rows = [
        {
            "idempotency_key": effect_key("csv", i),
            "endpoint": "hook",
            "payload": json.dumps({"text": text}),
            "recipient": text,
            "ordering_key": None if i % 2 else text,
            "reject_reason": None,
            "not_before": dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC) if i else None,
        }
        for i, text in enumerate(awkward)
    ]
    bad = {**batch_rows[0], "idempotency_key": "bad", "recipient": 'x,"y"\n'}
    batch = pa.RecordBatch.from_pylist([*batch_rows, bad], schema=EFFECT_ARROW_SCHEMA)
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cur:
            assert stage(cur, "effects", [batch], ATTEMPT, 3) == len(batch_rows) + 1
            cur.execute(
                "SELECT idempotency_key, recipient, ordering_key, payload, payload_sha256, "
                "not_before, reject_reason, raw_row FROM staged_effects "
                "WHERE reject_reason IS NULL ORDER BY payload->>'text'"
            )
            stored = cur.fetchall()
            cur.execute(
                "SELECT reject_reason, raw_row FROM staged_effects WHERE raw_row IS NOT NULL"
            )
            rejected = cur.fetchall()
        raw.rollback()
    finally:
        raw.close()
    want = sorted(batch_rows, key=lambda r: json.loads(r["payload"])["text"])
    for row, (key, recipient, ordering, payload, sha, not_before, reason, raw_row) in zip(
        want, stored, strict=True
    ):
        _, data = _check(row)
        assert data is not None
        assert (key, recipient, ordering, reason, raw_row) == (
            row["idempotency_key"],
            row["recipient"],
            row["ordering_key"],
            None,
            None,
        )
        assert payload == json.loads(data) and sha == payload_sha256(data)
        assert not_before == row["not_before"]
    assert len(rejected) == 1 and rejected[0][0].startswith("idempotency_key")
    assert json.loads(rejected[0][1])["recipient"] == 'x,"y"\n'
