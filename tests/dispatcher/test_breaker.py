"""The circuit breaker's policy is three settings (OUTBOX_BREAKER_*), passed to the record
statement: a changed threshold changes when an endpoint starts to rest, on a real
PostgreSQL, with a real worker against a real receiver."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Breaker, Settings
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker


def _failing_endpoint(engine: Engine, n: int, url: str = "http://127.0.0.1:9/hook") -> None:
    insert_endpoint(engine, "hook", url=url)
    with engine.begin() as conn:
        for i in range(n):
            enqueue(conn, idempotency_key=effect_key("breaker", i), endpoint="hook", payload={})


def _budget(engine: Engine) -> tuple[int, dt.datetime | None]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT failures, resting_until FROM endpoint_budgets WHERE endpoint = 'hook'")
        ).one()
    return row[0], row[1]


def _fail(engine: Engine, breaker: Breaker, *, prepared: bool) -> None:
    now = dt.datetime.now(dt.UTC)
    results = [
        store.Result(c.id, c.lease_token, c.attempt, "retry", now, 1.0, delay_s=60.0, error="500")
        for c in store.claim(engine, "w", 10, 30)
    ]
    store.record(engine, "w", results, prepared=prepared, breaker=breaker)


@pytest.mark.parametrize("prepared", [False, True])
def test_two_failures_rest_an_endpoint_only_when_the_threshold_is_two(
    engine: Engine, prepared: bool
) -> None:
    _failing_endpoint(engine, 2)
    _fail(engine, Breaker(), prepared=prepared)
    assert _budget(engine) == (2, None)  # the default: from the 5th failure

    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE effects SET next_attempt_at = now()"))
        conn.execute(sa.text("UPDATE endpoint_budgets SET failures = 0"))
    before = dt.datetime.now(dt.UTC)
    _fail(engine, Breaker(failures=2, base_s=30.0, max_s=45.0), prepared=prepared)
    failures, resting_until = _budget(engine)
    assert failures == 2 and resting_until is not None
    # The 2nd failure is the first at the threshold: a rest of base_s (30 s) exactly.
    rest_s = (resting_until - before).total_seconds()
    assert 29.0 < rest_s < 31.0


def test_the_rest_doubles_up_to_the_longest_rest(engine: Engine) -> None:
    _failing_endpoint(engine, 4)
    before = dt.datetime.now(dt.UTC)
    _fail(engine, Breaker(failures=1, base_s=10.0, max_s=50.0), prepared=False)
    # 4 failures at once from a threshold of 1: 10 * 2^3 = 80 s, cut to 50 s.
    rest_s = (_budget(engine)[1] - before).total_seconds()  # type: ignore[operator]
    assert 49.0 < rest_s < 51.0


def test_a_worker_with_a_threshold_of_three_rests_an_endpoint_after_three_failures(
    fast: Settings, engine: Engine, receiver: Receiver
) -> None:
    receiver.script("/hook", 500)
    _failing_endpoint(engine, 3, url=receiver.url("/hook"))
    # One attempt each (the schedule's single entry): three dead effects, three failures.
    settings = dataclasses.replace(fast, retry_schedule_s=(0.0,), breaker_failures=3)
    assert run_worker(settings, engine) == 0
    failures, resting_until = _budget(engine)
    assert failures == 3 and resting_until is not None and len(receiver.seen("/hook")) == 3


def test_a_worker_with_the_default_threshold_does_not_rest_it_after_three(
    fast: Settings, engine: Engine, receiver: Receiver
) -> None:
    receiver.script("/hook", 500)
    _failing_endpoint(engine, 3, url=receiver.url("/hook"))
    assert run_worker(dataclasses.replace(fast, retry_schedule_s=(0.0,)), engine) == 0
    assert _budget(engine) == (3, None)


def test_the_breaker_settings_are_read_from_the_environment() -> None:
    env = {
        "OUTBOX_BREAKER_FAILURES": "3",
        "OUTBOX_BREAKER_BASE_S": "0.5",
        "OUTBOX_BREAKER_MAX_S": "300",
    }
    assert Settings.from_env(env).breaker == Breaker(failures=3, base_s=0.5, max_s=300.0)
    assert Settings.from_env({}).breaker == Breaker(failures=5, base_s=1.0, max_s=60.0)


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("OUTBOX_BREAKER_FAILURES", "0", "use 1 to 1000"),
        ("OUTBOX_BREAKER_FAILURES", "1000000", "use 1 to 1000"),
        ("OUTBOX_BREAKER_BASE_S", "nan", "OUTBOX_BREAKER_BASE_S=nan is out of range"),
        ("OUTBOX_BREAKER_BASE_S", "0", "use 0.001 to 86400 seconds"),
        ("OUTBOX_BREAKER_MAX_S", "1e308", "use 0.001 to 86400 seconds"),
        ("OUTBOX_BREAKER_MAX_S", "inf", "OUTBOX_BREAKER_MAX_S=inf is out of range"),
        ("OUTBOX_BREAKER_MAX_S", "0.5", "lower the first rest or raise the longest"),
    ],
)
def test_breaker_settings_out_of_range_are_refused_at_start(
    name: str, value: str, said: str
) -> None:
    with pytest.raises(ConfigurationError, match=said):
        Settings.from_env({name: value})
