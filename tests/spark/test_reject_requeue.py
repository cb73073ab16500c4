"""An effect naming an endpoint nobody registered yet is a reject, and a re-run of
its batch is a replay: ``rejects.requeue`` is the way back, against real Spark,
PostgreSQL, the CLI and a receiver. Only that reject is requeued; a job's own
reject and a row that fails the checks again stay rejects."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.console import rejects
from spark_outbox.core.errors import UnknownEndpoint
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker
from tests.spark.helpers import sink, table
from tests.test_lifecycle_cli import _cli

pytestmark = pytest.mark.spark

SCHEMA = "idempotency_key string, endpoint string, payload string, reject_reason string"


def _row(i: int, endpoint: str, payload: str | None = None, why: str | None = None) -> tuple:
    return (effect_key("late", i), endpoint, payload or json.dumps({"n": i}), why)


def _requeue(engine: Engine, *, dry_run: bool) -> rejects.RequeuedRejects:
    with engine.begin() as conn:
        return rejects.requeue(
            conn, "t", "b1", actor="test", reason="endpoint registered late", dry_run=dry_run
        )


def _count(engine: Engine, sql: str) -> int:
    return int(table(engine, sql)[0][0])


def test_unknown_endpoint_rejects_are_enqueued_again_once_it_is_registered(
    spark: Any, db_url: str, engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    insert_endpoint(engine, "hook", url=receiver.url())
    rows = [
        *(_row(i, "hook") for i in range(3)),
        *(_row(i, "late") for i in range(3, 5)),
        _row(5, "late", why="customer unknown"),  # the job's own verdict: stays
        _row(6, "late", payload="[1, 2]"),  # not an object: a payload reject, stays
        _row(7, "never"),  # still unregistered at requeue time: refused again, stays
    ]
    out = sink(db_url, results=None).write(None, spark.createDataFrame(rows, SCHEMA), batch_id="b1")
    assert (out.status, out.effects_new, out.rejects) == ("committed", 3, 5)

    still_unknown = _requeue(engine, dry_run=False)
    assert (still_unknown.matched, still_unknown.enqueued) == (3, 0)
    assert still_unknown.still_refused == {
        str(UnknownEndpoint("late")): 2,
        str(UnknownEndpoint("never")): 1,
    }
    assert _count(engine, "SELECT count(*) FROM operator_actions") == 0  # nothing was done

    insert_endpoint(engine, "late", url=receiver.url())
    dry = _requeue(engine, dry_run=True)
    assert (dry.matched, dry.enqueued, dry.known, dry.dry_run) == (3, 2, 0, True)
    assert dry.still_refused == {str(UnknownEndpoint("never")): 1}
    assert _count(engine, "SELECT count(*) FROM effects") == 3  # a dry run writes nothing
    assert _count(engine, "SELECT count(*) FROM rejects WHERE requeued_at IS NOT NULL") == 0

    assert _cli(db_url, "rejects", "requeue", "t", "b1", "--reason", "registered late") == 0
    assert _count(engine, "SELECT count(*) FROM effects WHERE endpoint = 'late'") == 2
    assert _count(engine, "SELECT count(*) FROM rejects WHERE requeued_at IS NOT NULL") == 2
    actions = table(engine, "SELECT action, target, details FROM operator_actions")
    assert [(a, t, d["enqueued"]) for a, t, d in actions] == [("requeue_rejects", "t/b1", 2)]

    again = _requeue(engine, dry_run=False)  # only the refused row is left to try
    assert (again.matched, again.enqueued, again.known) == (1, 0, 0)

    replay = sink(db_url, results=None).write(
        None, spark.createDataFrame(rows, SCHEMA), batch_id="b1"
    )
    assert replay.status != "committed"  # a replay: enqueues nothing
    fast = dataclasses.replace(settings, worker_id="rq", poll_interval_s=0.1, lease_s=5.0)
    run_worker(fast, engine, idle_within_s=0.5)
    sent = receiver.keys()
    assert sorted(sent) == sorted(effect_key("late", i) for i in range(5))
