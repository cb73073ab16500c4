"""Say why nothing is sent: an endpoint whose receiver times out rests under the circuit
breaker, and the status, the support page, the metrics and the dispatcher's progress
line all say so (resting until when, after which streak, the last failure), read
from the budget row the claim obeys. A real `outbox dispatcher run` against a real
receiver that answers too late."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.console import tokens
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from tests.api.test_ui import _sign_in
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply

TIMEOUTS = 13  # the story: 13 timeouts, then a rest of the longest rest (60 s)


def _budget(engine: Engine) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT failures, resting_until, last_failure FROM endpoint_budgets "
                "WHERE endpoint = 'slow'"
            )
        ).one()


def _progress_lines(log: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "worker.progress"]


def _resting_in_progress(log: Path) -> bool:
    return any(
        e["endpoint"] == "slow" and e["state"] == "resting"
        for line in _progress_lines(log)
        for e in line["held_back"]
    )


def test_an_endpoint_resting_after_timeouts_says_so_everywhere(
    engine: Engine, settings: Settings, receiver: Receiver, db_url: str, tmp_path: Path
) -> None:
    receiver.script("/slow", Reply(200, delay_s=3.0))
    with engine.begin() as conn:
        add_webhook(conn, name="slow", url=receiver.url("/slow"), timeout_s=0.3)
    procs.enqueue_many(engine, TIMEOUTS, endpoint="slow")
    log = tmp_path / "dispatcher.log"
    env = procs.worker_env(
        db_url,
        OUTBOX_LOG_LEVEL="INFO",
        OUTBOX_PROGRESS_INTERVAL_S="0.5",
        # Every retry a second later, however many times an effect failed before the
        # rest began (on a loaded machine some are claimed again before it): all due
        # again a second after the worker stops, none claimed.
        OUTBOX_RETRY_SCHEDULE_S=",".join(["1"] * 20),
    )
    proc = procs.start(env, log=log)
    try:
        procs.wait_for(lambda: _budget(engine).failures >= TIMEOUTS, 60, "13 timeouts")
        procs.wait_for(lambda: _resting_in_progress(log), 30, "a progress line naming the rest")
    finally:
        assert procs.stop(proc) == 0
    time.sleep(1.5)  # every pending effect's next attempt has come
    failures, resting_until, last_failure = _budget(engine)
    assert failures == TIMEOUTS and last_failure == "Timeout"
    rest_s = (resting_until - dt.datetime.now(dt.UTC)).total_seconds()
    assert 10 < rest_s <= 60  # 1 s doubling from the 5th failure, at most 60 s (taken later)

    line = next(p for p in reversed(_progress_lines(log)) if p["held_back"])
    [held] = [e for e in line["held_back"] if e["endpoint"] == "slow"]
    assert held["state"] == "resting"
    assert "13 failed attempts in a row since" in held["why"] and "the last: Timeout" in held["why"]
    assert "resting until" in line["msg"] and "slow (" in line["msg"]

    with engine.begin() as conn:
        _, support = tokens.create(conn, name="sam", role="support")
    with TestClient(create_app(settings), base_url="https://testserver") as client:
        status = client.get("/v1/status", headers={"Authorization": f"Bearer {support}"}).json()
        [slow] = [e for e in status["endpoints"] if e["name"] == "slow"]
        assert slow["state"] == "resting" and slow["consecutive_failures"] == TIMEOUTS
        assert slow["last_failure"] == "Timeout" and slow["resting_until"] is not None
        assert slow["state_reason"].startswith("resting until ")
        assert slow["due_now"] == TIMEOUTS  # each due again after a second, none claimed
        metrics = _samples(client.get("/metrics").text)
        assert metrics[("outbox_endpoint_state", ("slow", "resting"))] == 1
        assert metrics[("outbox_endpoint_state", ("slow", "ready"))] == 0
        assert metrics[("outbox_endpoint_failures", ("slow",))] == TIMEOUTS
        assert metrics[("outbox_endpoint_queue_depth", ("slow",))] == TIMEOUTS
        _sign_in(client, support)
        page = client.get("/ui").text
    assert 'data-endpoint="slow"' in page and ">resting</td>" in page
    assert slow["state_reason"] in page and "(last: Timeout)" in page
    with engine.connect() as conn:
        rests = conn.execute(
            sa.text("SELECT actor FROM operator_actions WHERE action = 'rest_endpoint'")
        ).all()
    assert [r.actor for r in rests] == ["system"]  # one rest, extended: one row


def _samples(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (s.name, tuple(s.labels.values())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
