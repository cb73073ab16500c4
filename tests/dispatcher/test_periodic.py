"""The worker's periodic side tasks share one loop (periodic.every): it runs its step
each interval, ends as soon as the worker stops, and a step that fails stops the
worker with a non-zero exit (a supervisor restarts it), as before."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import periodic
from spark_outbox.dispatch.worker import Worker
from tests.conftest import insert_endpoint


def test_a_step_runs_each_interval_and_the_loop_ends_as_soon_as_stop_is_set() -> None:
    async def main() -> tuple[list[float], float]:
        stop, ran = asyncio.Event(), []

        async def step() -> None:
            ran.append(time.monotonic())

        task = asyncio.create_task(periodic.every(0.05, step, stop=stop))
        await asyncio.sleep(0.27)
        stop.set()
        stopped = time.monotonic()
        await asyncio.wait_for(task, 1.0)
        return ran, time.monotonic() - stopped

    ran, took_s = asyncio.run(main())
    assert 4 <= len(ran) <= 7  # at 0, 0.05, ... 0.25 s
    assert took_s < 0.05  # not a whole interval later


def test_wait_first_runs_the_first_step_an_interval_after_the_start() -> None:
    async def main() -> list[float]:
        stop, ran = asyncio.Event(), []

        async def step() -> None:
            ran.append(time.monotonic())

        started = time.monotonic()
        task = asyncio.create_task(periodic.every(0.1, step, stop=stop, wait_first=True))
        await asyncio.sleep(0.15)
        stop.set()
        await task
        return [t - started for t in ran]

    (first,) = asyncio.run(main())
    assert first >= 0.1


def test_a_failing_step_ends_the_loop_with_its_error() -> None:
    async def step() -> None:
        raise ValueError("broken step")

    with pytest.raises(ValueError, match="broken step"):
        asyncio.run(periodic.every(0.01, step, stop=asyncio.Event()))


def test_a_crashed_periodic_side_task_stops_the_worker_with_a_non_zero_exit(
    fast: Settings, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    insert_endpoint(engine, "hook")
    # The heartbeat's table gone: its step fails (not "the database is away", which
    # every store call retries), so the side task crashes.
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE worker_heartbeats"))
    caplog.set_level(logging.ERROR, logger="spark_outbox.dispatch.worker")

    async def main() -> int:
        worker = Worker(dataclasses.replace(fast), engine, database_url=fast.database_url)
        return await asyncio.wait_for(worker.run(), 30)

    assert asyncio.run(main()) == 1
    crashed = [r for r in caplog.records if getattr(r, "event", None) == "worker.crashed"]
    assert [r.task for r in crashed] == ["heartbeat"]  # type: ignore[attr-defined]
