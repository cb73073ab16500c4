"""The recorder against real PostgreSQL: one row the database refuses never sinks
the others, and is itself recorded without its outside texts."""

from __future__ import annotations

import asyncio
import datetime as dt
import math

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core import outside
from spark_outbox.dispatch import store
from spark_outbox.dispatch.dbcalls import DbCalls
from spark_outbox.dispatch.metrics import Metrics
from spark_outbox.dispatch.recorder import Recorder
from tests.conftest import insert_endpoint
from tests.dispatcher import procs


def _result(c: store.Claimed, excerpt: str, duration_ms: float = 1.0) -> store.Result:
    return store.Result(
        effect_id=c.id,
        lease_token=c.lease_token,
        attempt=c.attempt,
        outcome="delivered",
        started_at=dt.datetime.now(dt.UTC),
        duration_ms=duration_ms,
        status_code=200,
        response_excerpt=excerpt,
        endpoint=c.endpoint,
        idempotency_key=c.idempotency_key,
    )


@pytest.mark.parametrize(
    ("excerpt", "duration_ms"),
    [
        # A raw NUL (what used to reach SQL uncleaned): PostgreSQL refuses it.
        ("HTTP 200\x00", 1.0),
        # A lone surrogate: not UTF-8 at all.
        ("HTTP 200 \udc80", 1.0),
        # A NaN: JSON (how the batch is sent) has none; the batch fails before it is sent.
        ("HTTP 200", float("nan")),
    ],
    ids=["nul", "lone-surrogate", "nan-duration"],
)
def test_a_row_the_database_refuses_is_recorded_without_its_texts_and_the_rest_as_usual(
    engine: Engine, excerpt: str, duration_ms: float
) -> None:
    insert_endpoint(engine, "hook")
    procs.enqueue_many(engine, 5)
    claimed = store.claim(engine, "w", 10, 60.0)
    results = [
        _result(c, excerpt, duration_ms) if i == 2 else _result(c, "HTTP 200")
        for i, c in enumerate(claimed)
    ]

    async def main() -> Recorder:
        db = DbCalls(engine)
        settled: list[int] = []
        recorder = Recorder(
            db, "w", Metrics(), batch_size=100, give_up_s=5.0, recorded=settled.append
        )
        for r in results:
            recorder.queue.put_nowait(r)
        recorder.queue.put_nowait(None)
        await asyncio.wait_for(recorder.run(), 30)
        db.close()
        assert sum(settled) == 5
        return recorder

    recorder = asyncio.run(main())
    assert recorder.counts == {"delivered": 5}
    assert procs.states(engine) == {"delivered": 5}
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT error_class, error, response_excerpt FROM delivery_attempts")
        ).all()
    assert len(rows) == 5
    (replaced,) = [r for r in rows if r.error_class == "RecordFailed"]
    assert "refused by the database" in replaced.error and replaced.response_excerpt is None
    with engine.connect() as conn:
        durations = conn.execute(sa.text("SELECT duration_ms FROM delivery_attempts")).scalars()
        assert all(math.isfinite(d) for d in durations)


@given(st.one_of(st.binary(max_size=6000), st.text(max_size=3000)), st.integers(1, 3000))
def test_clean_text_is_valid_utf8_without_control_characters_and_within_both_limits(
    raw: bytes | str, limit: int
) -> None:
    text = outside.clean(raw, max_chars=limit, max_bytes=limit)
    assert text is not None
    data = text.encode("utf-8")  # raises on a lone surrogate
    assert len(text) <= limit and len(data) <= limit
    assert not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


def test_clean_text_escapes_nul_and_keeps_what_a_person_reads() -> None:
    assert outside.clean(b"ok\x00\r\nnext\tcol\n\xff") == "ok\\x00\\x0d\nnext\tcol\n\ufffd"
    assert outside.clean("a\udcff") == "a\ufffd\ufffd\ufffd"


def test_an_unexpected_exception_is_logged_cleaned_with_where_it_was_raised() -> None:
    try:
        raise ValueError("receiver said \x00\x1b[31mred\r\nforged: line")
    except ValueError as exc:
        fields = outside.failure(exc)
    assert fields["error"] == "ValueError: receiver said \\x00\\x1b[31mred\\x0d\nforged: line"
    assert "test_recorder.py" in fields["where"] and "\x00" not in fields["where"]
