"""``rejects.requeue`` with the reject rows as the sink stores them (the row as JSON
text, datetimes written by ``str``), on a real PostgreSQL: a ``not_before`` comes back
as the instant it was, and one that cannot (naive, not a time) is refused again with
the field named, never enqueued without its delay."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.console import rejects
from spark_outbox.core.errors import UnknownEndpoint
from spark_outbox.core.keys import effect_key
from tests.conftest import insert_endpoint


def _reject(engine: Engine, i: int, not_before: object) -> str:
    key = effect_key("nb", i)
    row = {"idempotency_key": key, "endpoint": "late", "payload": '{"n": 1}'}
    raw = json.dumps(row | {"not_before": not_before}, default=str)  # as spark.checks.raw_json
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO rejects (job, batch_id, reason, raw_row)"
                " VALUES ('t', 'b1', :reason, CAST(:raw AS jsonb))"
            ),
            {"reason": str(UnknownEndpoint("late")), "raw": raw},
        )
    return key


def test_a_requeued_reject_keeps_its_not_before(engine: Engine) -> None:
    later = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    kept = _reject(engine, 0, later)  # str(): '2031-05-06 07:08:09.123456+02:00'
    _reject(engine, 1, later.replace(tzinfo=None))  # naive: no instant
    _reject(engine, 2, "tomorrow")
    none = _reject(engine, 3, None)
    insert_endpoint(engine, "late")
    with engine.begin() as conn:
        done = rejects.requeue(
            conn, "t", "b1", actor="test", reason="registered late", dry_run=False
        )
    assert (done.matched, done.enqueued) == (4, 2)
    assert sum(done.still_refused.values()) == 2
    assert all(reason.startswith("not_before:") for reason in done.still_refused), done
    with engine.connect() as conn:
        due = dict(
            conn.execute(sa.text("SELECT idempotency_key, next_attempt_at FROM effects")).all()
        )
    assert set(due) == {kept, none}
    assert due[kept] == later  # the same instant, not "now"
