"""Each rest of the circuit breaker is in the audit trail as the system's, once: when
it begins (not when a running rest is extended), however many dispatchers record
failures at the same moment; with why, in our own words, never the receiver's text."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Breaker
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint

BREAKER = Breaker(failures=2, base_s=30.0, max_s=45.0)


def _claimed(engine: Engine, n: int) -> list[store.Claimed]:
    insert_endpoint(engine, "hook")
    with engine.begin() as conn:
        for i in range(n):
            enqueue(conn, idempotency_key=effect_key("rest", i), endpoint="hook", payload={})
    return store.claim(engine, "w", n, 60)


def _fail(engine: Engine, claimed: list[store.Claimed], **result: Any) -> None:
    now = dt.datetime.now(dt.UTC)
    results = [
        store.Result(c.id, c.lease_token, c.attempt, "retry", now, 1.0, delay_s=60.0, **result)
        for c in claimed
    ]
    store.record(engine, "w", results, breaker=BREAKER)


def _rests(engine: Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT actor, target, reason, details FROM operator_actions "
                "WHERE action = 'rest_endpoint' ORDER BY id"
            )
        ).all()


def _budget(engine: Engine) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT failures, resting_until, resting_since, last_failure "
                "FROM endpoint_budgets WHERE endpoint = 'hook'"
            )
        ).one()


def test_a_rest_is_audited_once_when_it_begins_and_again_for_the_next_rest(
    engine: Engine,
) -> None:
    claimed = _claimed(engine, 6)
    _fail(engine, claimed[:1], status_code=503, error="Service Unavailable: card 4111")
    assert _rests(engine) == [] and _budget(engine).last_failure == "HTTP 503"

    _fail(engine, claimed[1:2], error_class="Timeout", error="no answer in 10s")
    [rest] = _rests(engine)
    budget = _budget(engine)
    assert rest.actor == "system" and rest.target == "hook"
    assert "2 failed attempts in a row since" in rest.reason
    assert "(the last: Timeout)" in rest.reason and "4111" not in rest.reason
    assert rest.details["failures"] == 2 and rest.details["last_failure"] == "Timeout"
    assert budget.resting_since is not None and budget.resting_until > budget.resting_since

    # Two more failures while it rests (sends claimed before the rest): extended, not a new one.
    _fail(engine, claimed[2:4], status_code=500)
    assert len(_rests(engine)) == 1
    assert _budget(engine).resting_since == budget.resting_since
    assert _budget(engine).last_failure == "HTTP 500"

    # The rest ran out; the next failure begins a new rest, and a new row.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE endpoint_budgets SET resting_until = now() - interval '1s'"))
    _fail(engine, claimed[4:5], error_class="ConnectionRefused")
    rests = _rests(engine)
    assert len(rests) == 2 and "5 failed attempts in a row" in rests[1].reason

    # One delivery ends the streak: nothing left to say why.
    now = dt.datetime.now(dt.UTC)
    c = claimed[5]
    store.record(engine, "w", [store.Result(c.id, c.lease_token, c.attempt, "delivered", now, 1.0)])
    assert tuple(_budget(engine)) == (0, None, None, None)


def test_records_waiting_on_each_other_begin_one_rest_between_them(engine: Engine) -> None:
    """Two dispatchers' records blocked on the budget row, then let go together: the
    second sees the first's rest on the row it locks, and writes no second row."""
    claimed = _claimed(engine, 4)
    _fail(engine, claimed[:1], status_code=500)  # one short of the threshold
    threads = [
        threading.Thread(target=_fail, args=(engine, [c]), kwargs={"status_code": 502})
        for c in claimed[1:3]
    ]
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT 1 FROM endpoint_budgets WHERE endpoint = 'hook' FOR UPDATE"))
        for t in threads:
            t.start()
        _wait_for_waiters(engine, 2)
        holder.rollback()
    for t in threads:
        t.join(30)
    assert _budget(engine).failures == 3
    assert len(_rests(engine)) == 1


def _wait_for_waiters(engine: Engine, n: int) -> None:
    """Until ``n`` sessions wait for a lock (the records reached the budget row)."""
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)
    while dt.datetime.now(dt.UTC) < deadline:
        with engine.connect() as conn:
            waiting = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        if waiting >= n:
            return
    raise AssertionError(f"{n} records never waited on the budget row")
