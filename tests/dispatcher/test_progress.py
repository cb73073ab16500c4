"""The periodic progress line: human-readable text, structured fields in JSON."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.logs import JsonFormatter, TextFormatter
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import progress
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply, run_worker


def test_the_worker_logs_what_it_settled_the_rate_and_the_queue_every_interval(
    engine: Engine, fast: Settings, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script("/hook", Reply(200, delay_s=0.05))
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    procs.enqueue_many(engine, 40)
    caplog.set_level(logging.INFO, logger="spark_outbox.dispatch.worker")
    s = dataclasses.replace(fast, progress_interval_s=0.2, concurrency=4)
    assert run_worker(s, engine, idle_within_s=0.5) == 0
    lines = [r for r in caplog.records if getattr(r, "event", None) == "worker.progress"]
    assert len(lines) >= 2
    assert sum(r.delivered for r in lines) <= 40  # type: ignore[attr-defined]
    busy = max(lines, key=lambda r: r.delivered)  # type: ignore[attr-defined]
    assert busy.delivered > 0 and busy.rate_per_s > 0  # type: ignore[attr-defined]
    text = TextFormatter().format(busy)
    assert f"progress: {busy.delivered} delivered, 0 retried, 0 dead" in text  # type: ignore[attr-defined]
    fields = json.loads(JsonFormatter().format(busy))
    assert {"delivered", "retried", "dead", "rate_per_s", "queue_depth"} <= fields.keys()
    assert fields["event"] == "worker.progress"


def test_progress_interval_zero_turns_the_line_off(
    engine: Engine, fast: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="spark_outbox.dispatch.worker")
    s = dataclasses.replace(fast, progress_interval_s=0.0)
    assert run_worker(s, engine, idle_within_s=0.3) == 0
    assert not [r for r in caplog.records if getattr(r, "event", None) == "worker.progress"]
    assert Settings.from_env(env={"OUTBOX_PROGRESS_INTERVAL_S": "0"}).progress_interval_s == 0


def test_the_line_names_at_most_five_endpoints_held_back_and_counts_the_rest() -> None:
    held = [
        {"endpoint": f"e{i}", "state": "paused", "why": "paused: r", "due": i} for i in range(7)
    ]
    f = {"delivered": 0, "retried": 0, "dead": 0, "rate_per_s": 0.0, "queue_depth": 0}
    text = progress.line(f | {"in_flight": 0, "held_back": held}, 30)
    assert "; e4 (4 due): paused: r; 2 more held back (GET /v1/status)" in text
    assert "e5" not in text
