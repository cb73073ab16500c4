"""DbCalls: a store call is retried while the database is away
(dispatcher/dispatch/dbcalls.py). The outage drills (test_pg_restart, test_pgbouncer)
stop a real PostgreSQL; these pin the rules: one try when the database answers, the
retries and their log, the give-up time, a stop while retrying."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from spark_outbox.core.errors import DatabaseUnavailable
from spark_outbox.dispatch.dbcalls import DbCalls


class Flaky:
    """Fails with DatabaseUnavailable its first ``failures`` calls, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self, engine: Any, value: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise DatabaseUnavailable(f"away ({self.calls})")
        return value


def _call(fn: Flaky, **kwargs: Any) -> str | None:
    async def main() -> str | None:
        calls = DbCalls(engine=None, threads=1)  # type: ignore[arg-type]
        try:
            return await calls.call(fn, "answer", **kwargs)
        finally:
            calls.close()

    return asyncio.run(main())


def test_a_call_that_finds_the_database_answers_at_the_first_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)  # where a retry would be logged
    fn = Flaky(0)
    assert _call(fn) == "answer" and fn.calls == 1
    assert not [r for r in caplog.records if getattr(r, "event", "") == "db.retry"]


def test_a_call_is_retried_while_the_database_is_away_each_retry_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    fn = Flaky(3)
    started = time.monotonic()
    assert _call(fn) == "answer" and fn.calls == 4
    # waits of 0.1, 0.2, 0.4 s (and up to 0.1 s of jitter each) between the tries
    assert 0.7 <= time.monotonic() - started < 5.0
    retries = [r.__dict__["retry"] for r in caplog.records if r.__dict__.get("event") == "db.retry"]
    assert retries == [1, 2, 3]


def test_a_call_gives_up_after_its_time_and_a_stop_ends_the_retries() -> None:
    fn = Flaky(1_000)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable):
        _call(fn, give_up_after_s=0.5)
    assert time.monotonic() - started < 3.0 and fn.calls >= 2

    async def stopped() -> str | None:
        calls, stop = DbCalls(engine=None, threads=1), asyncio.Event()  # type: ignore[arg-type]
        stop.set()
        try:
            return await calls.call(Flaky(1_000), "answer", until=stop)
        finally:
            calls.close()

    assert asyncio.run(stopped()) is None  # the first try ran; no retry once stopping
