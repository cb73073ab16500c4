"""Send-by times from Spark: the optional ``expires_at`` effect column, through the
sink's real write path (local[2], binary COPY) into a real outbox and a real worker."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker
from tests.spark.helpers import sink, table

pytestmark = pytest.mark.spark

SCHEMA = (
    "idempotency_key string, endpoint string, payload string, not_before timestamp, "
    "expires_at timestamp"
)


def test_the_expires_at_column_is_stored_enforced_and_checked_against_not_before(
    spark: Any, db_url: str, engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    insert_endpoint(engine, "hook", url=receiver.url())
    now = dt.datetime.now(dt.UTC)
    later, past = now + dt.timedelta(hours=1), now - dt.timedelta(hours=1)
    rows = [
        (effect_key("x", "later"), "hook", json.dumps({"n": 1}), None, later),
        (effect_key("x", "past"), "hook", json.dumps({"n": 2}), None, past),
        (effect_key("x", "none"), "hook", json.dumps({"n": 3}), None, None),
        (effect_key("x", "never"), "hook", json.dumps({"n": 4}), later, later),
    ]
    outcome = sink(db_url, results=None).write(
        None, spark.createDataFrame(rows, SCHEMA), batch_id="b1"
    )
    assert (outcome.effects_new, outcome.rejects) == (3, 1)
    stored = dict(table(engine, "SELECT idempotency_key, expires_at FROM effects"))
    assert stored == {
        effect_key("x", "later"): later,
        effect_key("x", "past"): past,
        effect_key("x", "none"): None,
    }
    ((reason,),) = table(engine, "SELECT reason FROM rejects")
    assert reason.startswith("expires_at: ") and "is not after not_before" in reason
    assert run_worker(fast, engine) == 0
    assert sorted(receiver.keys()) == sorted([effect_key("x", "later"), effect_key("x", "none")])
    past_key = effect_key("x", "past")
    ((state, error),) = table(
        engine, f"SELECT state, last_error FROM effects WHERE idempotency_key = '{past_key}'"
    )
    assert state == "expired" and error.endswith("had passed when it was enqueued")


def test_an_expires_at_column_that_is_not_a_timestamp_is_refused_before_anything_runs(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    effects = spark.createDataFrame(
        [(effect_key("x", 1), "hook", "{}", "2026-11-27 12:00")],
        "idempotency_key string, endpoint string, payload string, expires_at string",
    )
    with pytest.raises(ConfigurationError, match=r"expires_at is string, not a timestamp"):
        sink(db_url, results=None).write(None, effects, batch_id="b1")
    assert table(engine, "SELECT count(*) FROM batches") == [(0,)]
