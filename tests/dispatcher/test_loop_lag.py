"""The event loop's lag (``watch_loop_lag``) as a worker's registry holds it. The
claim's duration is checked on a real worker's drain (test_cli.py)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from spark_outbox.dispatch.metrics import Metrics, watch_loop_lag


def _samples(registry: CollectorRegistry, name: str) -> tuple[float, float, float]:
    """(count, sum, observations above 0.1 s) of a histogram."""
    value = registry.get_sample_value
    count = value(f"{name}_count") or 0.0
    below = value(f"{name}_bucket", {"le": "0.1"}) or 0.0
    return count, value(f"{name}_sum") or 0.0, count - below


def test_a_blocked_event_loop_is_observed_as_lag_of_about_the_block() -> None:
    metrics = Metrics()

    async def scenario() -> None:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_loop_lag(metrics.loop_lag, stop=stop, every_s=0.02))
        await asyncio.sleep(0.1)  # samples of a loop with nothing else to run
        time.sleep(0.4)  # the loop held, as a saturated process holds it
        await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(watcher, 5)  # returns once stopping

    asyncio.run(scenario())
    count, total, late = _samples(metrics.registry, "outbox_event_loop_lag_seconds")
    assert count >= 3  # sampled before and after the block
    # The sample that spanned the block woke ~0.38-0.4 s late (its 0.02 s asked for
    # before the block began): only above 0.1 s when the block is measured, not the ask.
    assert late >= 1 and total >= 0.3


def test_a_loop_that_is_never_blocked_long_has_no_late_sample_of_its_own() -> None:
    """Each sample is the lateness, not the interval: sleeping 0.05 s, its samples are
    the loop's own (a few ms on a loaded machine), never the 0.05 s it asked for."""
    metrics = Metrics()

    async def scenario() -> None:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_loop_lag(metrics.loop_lag, stop=stop, every_s=0.05))
        await asyncio.sleep(0.6)
        stop.set()
        await asyncio.wait_for(watcher, 5)

    asyncio.run(scenario())
    count, total, _ = _samples(metrics.registry, "outbox_event_loop_lag_seconds")
    assert count >= 5
    # The interval observed would sum to count x 0.05 (or more: interval and lateness).
    assert total < count * 0.05 * 0.5
