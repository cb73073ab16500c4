"""The executors' checks and write path without Spark.

``checked_effects`` clears plain rows with Arrow compute functions and sends only
the rest through ``check_row``, the per-row contract check that ``enqueue``
shares (plus the endpoint kinds: unknown endpoints, the e-mail contract). The
property test says the shortcut never changes an outcome: every row gets
exactly the reason, the canonical payload and the hash the per-row check gives.
The round-trip tests send awkward (and arbitrary) text through the binary COPY and
the insert into the real outbox, and read it back unchanged (and invisible).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid
from typing import Any

import psycopg2
import pyarrow as pa
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.keys import effect_key
from spark_outbox.core.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_RECIPIENT_CHARS,
    MAX_REFERENCE_CHARS,
    payload_sha256,
)
from spark_outbox.spark.checks import COLUMN_SCREEN, check_row, checked_effects, raw_json
from spark_outbox.spark.chunks import write_effects
from spark_outbox.spark.protocol import RunTag
from tests.spark.helpers import EFFECT_ARROW_SCHEMA

RUN = "00000000-0000-0000-0000-0000000000aa"
ENDPOINTS = {"hook": "webhook", " hook": "webhook", "mail": "email"}

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
            json.dumps({"subject": "Your invoice", "text": "Amount: 3 EUR"}),
            json.dumps({"subject": "two\nlines", "text": "x"}),
            json.dumps({"subject": "no text"}),
        ]
    ),
)
keys = st.one_of(
    st.integers(0, 10**6).map(lambda i: effect_key("t", i)),
    st.sampled_from([None, "", "not-a-key", "A" * 64, effect_key("t", 1).upper(), "0" * 63]),
)
endpoints = st.sampled_from(
    [None, "", "   ", "\u00a0", "\u2003x", " hook", "hook", "a\x00b", "mail", "nope"]
)
optional_texts = st.one_of(
    st.none(),
    texts,
    st.just("r\x00"),
    st.just("ada@example.com"),
    st.just("ada@example.com, bob@example.com"),
    st.just("x" * (MAX_RECIPIENT_CHARS + 1)),
    st.just("y" * (MAX_ORDERING_KEY_CHARS + 1)),
    st.just("z" * (MAX_REFERENCE_CHARS + 1)),
)
rows = st.fixed_dictionaries(
    {
        "idempotency_key": keys,
        "endpoint": endpoints,
        "payload": payloads,
        "recipient": optional_texts,
        "ordering_key": optional_texts,
        "reference": optional_texts,
        "supersedes": st.one_of(st.none(), keys),
        "reject_reason": st.one_of(st.none(), st.just("declared by the job")),
        "not_before": st.one_of(
            st.none(), st.just(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
        ),
        # None, before or at not_before (never sendable: a reject), after it, or long past.
        "expires_at": st.sampled_from(
            [
                None,
                dt.datetime(2026, 1, 2, 3, 4, 4, tzinfo=dt.UTC),
                dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
                dt.datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=dt.UTC),
                dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
            ]
        ),
    }
)


def _expected(row: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(valid row, reject) as the per-row check says."""
    reason, data = check_row(row, ENDPOINTS)
    if reason is not None:
        return None, {"reason": reason, "raw_row": json.loads(raw_json(row))}
    valid = {k: row[k] for k in ("idempotency_key", "endpoint", "recipient", "ordering_key")}
    valid |= {"reference": row["reference"], "not_before": row["not_before"]}
    valid |= {"expires_at": row["expires_at"]}
    valid |= {"supersedes": row["supersedes"]}
    valid |= {"payload": data.decode("utf-8"), "payload_sha256": payload_sha256(data)}
    return valid, None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows, min_size=1, max_size=8))
def test_vectorised_checks_give_the_per_row_outcome(batch_rows: list[dict[str, Any]]) -> None:
    batch = pa.RecordBatch.from_pylist(batch_rows, schema=EFFECT_ARROW_SCHEMA)
    valid, rejects = checked_effects(batch, ENDPOINTS)
    expected = [_expected(row) for row in batch_rows]
    assert valid.to_pylist() == [v for v, _ in expected if v is not None]
    got_rejects = [{**r, "raw_row": json.loads(r["raw_row"])} for r in rejects.to_pylist()]
    assert got_rejects == [r for _, r in expected if r is not None]


# Numbers where orjson and json may print differently, and text that looks like them.
tricky_numbers = st.one_of(
    st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False),
    st.floats(min_value=1e14, max_value=1e20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(),  # unbounded: past 64 bits orjson reads a float
)
money_texts = st.from_regex(r"\A-?[0-9]{1,4}\.0{4}[0-9]?\Z|\A[:,\[]?0\.0000[1-9]\Z", fullmatch=True)
nul_free = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
screen_values = st.recursive(
    tricky_numbers | money_texts | nul_free,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(nul_free, inner, max_size=3),
    max_leaves=6,
)


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Effect rows as a record batch; the optional fields left out are null."""
    return pa.RecordBatch.from_pylist(
        [{name: row.get(name) for name in EFFECT_ARROW_SCHEMA.names} for row in rows],
        schema=EFFECT_ARROW_SCHEMA,
    )


def _definition(text: str) -> bytes:
    return json.dumps(
        json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(nul_free, screen_values, max_size=4), min_size=1, max_size=6))
def test_narrow_column_screen_keeps_every_payloads_canonical_bytes_and_hash(
    objects: list[dict[str, Any]],
) -> None:
    """COLUMN_SCREEN lets money-like text ("10.0000") keep orjson's bytes; every
    number orjson prints unlike json still sends its row to the exact path."""
    batch_rows = [
        {"idempotency_key": effect_key("screen", i), "endpoint": "hook", "payload": json.dumps(v)}
        for i, v in enumerate(objects)
    ]
    valid, rejects = checked_effects(_batch(batch_rows), ENDPOINTS)
    assert rejects.num_rows == 0
    want = [_definition(row["payload"]) for row in batch_rows]
    assert [p.encode("utf-8") for p in valid.column("payload").to_pylist()] == want
    assert valid.column("payload_sha256").to_pylist() == [
        hashlib.sha256(data).hexdigest() for data in want
    ]


def test_column_screen_lets_money_text_through_and_catches_tiny_numbers() -> None:
    screen = re.compile(COLUMN_SCREEN.encode())
    assert not screen.search(b'{"amount":"10.0000","memo":"0.00001"}')
    for caught in (b'{"a":0.00001}', b'{"a":[1,-0.00005]}', b'{"a":1e-7}', b'{"a":1e+16}'):
        assert screen.search(caught), caught


def test_email_effects_are_checked_against_the_email_contract() -> None:
    rows = [
        {"recipient": "ada@example.com", "payload": '{"subject": "Hi", "text": "x"}'},
        {"recipient": "Ada <ada@example.com>", "payload": '{"subject": "Hi", "text": "x"}'},
        {"recipient": "ada@example.com", "payload": '{"subject": "Hi"}'},
    ]
    full = [
        {"idempotency_key": effect_key("m", i), "endpoint": "mail", **r} for i, r in enumerate(rows)
    ]
    valid, rejects = checked_effects(_batch(full), ENDPOINTS)
    assert valid.column("recipient").to_pylist() == ["ada@example.com"]
    reasons = rejects.column("reason").to_pylist()
    assert reasons[0].startswith("recipient:") and "not exactly one e-mail address" in reasons[0]
    assert reasons[1].startswith("payload.text:")


def test_written_text_survives_binary_copy_and_insert_and_stays_invisible(
    db_url: str, engine: Engine
) -> None:
    awkward = ["a,b", 'quote " inside', "new\nline", "tab\there", "", "ünïcödé ✓", "back\\slash"]
    batch_rows = [
        {
            "idempotency_key": effect_key("csv", i),
            "endpoint": "hook",
            "payload": json.dumps({"text": text}),
            "recipient": text,
            "ordering_key": None if i % 2 else text,
            "reference": f"inv-{text}" if i % 2 else None,
            "reject_reason": None,
            "not_before": dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC) if i else None,
        }
        for i, text in enumerate(awkward)
    ]
    bad = {**batch_rows[0], "idempotency_key": "bad", "recipient": 'x,"y"\n'}
    batch = pa.RecordBatch.from_pylist([*batch_rows, bad], schema=EFFECT_ARROW_SCHEMA)
    run = RunTag(db.libpq_url(db_url), "t", "b1", RUN, ENDPOINTS)
    conn = psycopg2.connect(run.dsn)
    try:
        report = write_effects(conn, run, 3, [batch], chunk_rows=3)
    finally:
        conn.close()
    assert (report.rows, report.rejects, report.deferred) == (len(batch_rows), 1, 0)
    with engine.connect() as c:
        stored = c.execute(
            sa.text(
                "SELECT idempotency_key, recipient, ordering_key, reference, payload, "
                "payload_sha256, next_attempt_at, run_id::text FROM effects "
                "ORDER BY payload->>'text'"
            )
        ).all()
        rejected = c.execute(sa.text("SELECT reason, raw_row FROM staged_rejects")).all()
        visible = c.execute(sa.text("SELECT count(*) FROM visible_effects")).scalar_one()
    assert visible == 0  # no marker for the run yet
    want = sorted(batch_rows, key=lambda r: json.loads(r["payload"])["text"])
    for row, (key, recipient, ordering, reference, payload, sha, due, run_id) in zip(
        want, stored, strict=True
    ):
        _, data = check_row(row, ENDPOINTS)
        assert (key, recipient, ordering, reference, run_id) == (
            row["idempotency_key"],
            row["recipient"],
            row["ordering_key"],
            row["reference"],
            RUN,
        )
        assert payload == json.loads(data) and sha == payload_sha256(data)
        if row["not_before"] is not None:
            assert due == row["not_before"]
    assert len(rejected) == 1 and rejected[0][0].startswith("idempotency_key")
    assert rejected[0][1]["recipient"] == 'x,"y"\n'


field_texts = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
stored_rows = st.lists(
    st.fixed_dictionaries(
        {
            "recipient": st.one_of(st.none(), field_texts),
            "ordering_key": st.one_of(st.none(), field_texts),
            "reference": st.one_of(st.none(), field_texts),
            "payload": st.dictionaries(field_texts, json_values, max_size=4).map(json.dumps),
            "not_before": st.one_of(
                st.none(),
                st.datetimes(
                    min_value=dt.datetime(1900, 1, 1),
                    max_value=dt.datetime(2200, 1, 1),
                    timezones=st.just(dt.UTC),
                ),
            ),
            "expires_at": st.one_of(
                st.none(),
                st.datetimes(
                    min_value=dt.datetime(2200, 1, 2),
                    max_value=dt.datetime(2300, 1, 1),
                    timezones=st.just(dt.UTC),
                ),
            ),
        }
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(stored_rows)
def test_any_valid_row_survives_the_binary_copy_unchanged(
    db_url: str, engine: Engine, drawn: list[dict[str, Any]]
) -> None:
    """Whatever text, JSON and timestamps a valid row holds come back from the
    real table exactly: the binary COPY encoding loses and invents nothing."""
    run_id = str(uuid.uuid4())
    batch_rows = [
        {
            **row,
            "idempotency_key": effect_key("binary", run_id, i),
            "endpoint": "hook",
            "supersedes": None,
            "reject_reason": None,
            "reference": None if row["reference"] is None else row["reference"][:200],
        }
        for i, row in enumerate(drawn)
    ]
    expected = {r["idempotency_key"]: _expected(r)[0] for r in batch_rows}
    run = RunTag(db.libpq_url(db_url), "t", "b1", run_id, ENDPOINTS)
    conn = psycopg2.connect(run.dsn)
    try:
        report = write_effects(
            conn,
            run,
            1,
            [pa.RecordBatch.from_pylist(batch_rows, schema=EFFECT_ARROW_SCHEMA)],
            4,
        )
    finally:
        conn.close()
    with engine.connect() as c:
        stored = c.execute(
            sa.text(
                "SELECT idempotency_key, recipient, ordering_key, reference, "
                "payload_sha256, next_attempt_at, job, batch_id, created_at, expires_at "
                "FROM effects WHERE run_id = CAST(:run_id AS uuid)"
            ),
            {"run_id": run_id},
        ).all()
    valid = {k: v for k, v in expected.items() if v is not None}
    assert report.rows == len(valid)
    assert len(stored) == len(valid)
    for key, recipient, ordering, reference, sha, due, job, batch, created, expires in stored:
        want = valid[key]
        assert expires == want["expires_at"]
        assert (recipient, ordering, reference, job, batch) == (
            want["recipient"], want["ordering_key"], want["reference"], "t", "b1",
        )  # fmt: skip
        assert sha == want["payload_sha256"]
        assert due == (want["not_before"] or created)
    with engine.connect() as c:  # jsonb as PostgreSQL parses the canonical text itself
        for key, want in valid.items():
            same = c.execute(
                sa.text(
                    "SELECT payload = CAST(:p AS jsonb) FROM effects WHERE idempotency_key = :k"
                ),
                {"p": want["payload"], "k": key},
            ).scalar_one()
            assert same, key


def test_a_wide_batch_of_clean_screened_and_bad_payloads_gets_each_rows_own_bytes_and_hash() -> (
    None
):
    """The canonical bytes and digests of a batch are built in one buffer and patched
    where the exact path replaces a row: every row, far into the batch, keeps its own."""
    odd = ['{"a":1e-7}', "[1, 2]", "{not json", None, '{"b": 0.00001}', '{"a": NaN}']
    batch_rows = [
        {
            "idempotency_key": effect_key("wide", i),
            "endpoint": "hook",
            "payload": odd[i // 7 % len(odd)]
            if i % 7 == 3
            else json.dumps({"n": i, "m": "é" * (i % 5)}),
        }
        for i in range(5_000)
    ]
    batch = _batch(batch_rows)
    valid, rejects = checked_effects(batch, ENDPOINTS)
    expected = [_expected(row) for row in batch.to_pylist()]
    assert valid.num_rows == sum(v is not None for v, _ in expected) > 4_000
    assert valid.to_pylist() == [v for v, _ in expected if v is not None]
    assert rejects.column("reason").to_pylist() == [r["reason"] for _, r in expected if r]
