"""One trace from a Spark batch to every delivery attempt, exported to a real OTLP
receiver on loopback, and continued by the webhook receiver."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker
from tests.otlp import OtlpReceiver
from tests.spark.helpers import EFFECT_SCHEMA, INVOICE_SCHEMA, effect_rows, invoice_rows, sink

pytestmark = pytest.mark.spark


def test_a_batch_trace_holds_its_tasks_commit_and_every_send_of_its_effects(
    spark: Any, db_url: str, engine: Engine, fast: Settings, receiver: Receiver, otlp: OtlpReceiver
) -> None:
    insert_endpoint(engine, "hook", url=receiver.url())
    effects = spark.createDataFrame(effect_rows(12), EFFECT_SCHEMA).repartition(3)
    results = spark.createDataFrame(invoice_rows(4), INVOICE_SCHEMA)
    outcome = sink(db_url).write(results, effects, batch_id="b1")
    assert run_worker(fast, engine) == 0

    (batch,) = otlp.spans("outbox.batch")
    assert batch.parent_span_id == ""
    assert {k: batch.attributes[k] for k in ("outbox.job", "outbox.batch_id", "outbox.run_id")} == {
        "outbox.job": "t",
        "outbox.batch_id": "b1",
        "outbox.run_id": outcome.run_id,
    }
    counts = ("outbox.status", "outbox.effects_new", "outbox.result_rows", "outbox.rejects")
    assert [batch.attributes[k] for k in counts] == ["committed", 12, 4, 0]
    (write,) = otlp.spans("outbox.write")
    (commit,) = otlp.spans("outbox.commit")
    assert {write.parent_span_id, commit.parent_span_id} == {batch.span_id}
    assert commit.attributes["outbox.effects_new"] == 12
    # The executor tasks, drawn by the driver from the times they reported.
    tasks = otlp.spans("outbox.task")
    effect_tasks = [t for t in tasks if t.attributes["outbox.task.kind"] == "effects"]
    assert {t.parent_span_id for t in tasks} == {write.span_id}
    assert sum(t.attributes["outbox.task.rows"] for t in effect_tasks) == 12
    assert len(effect_tasks) == 3 and any(
        t.attributes["outbox.task.kind"] == "results" for t in tasks
    )
    assert all(write.start_ns <= t.start_ns <= t.end_ns <= write.end_ns for t in tasks)
    assert batch.start_ns <= write.start_ns <= commit.start_ns <= commit.end_ns <= batch.end_ns

    # Every send is a child of the batch's span; each receiver continues that trace.
    sends = otlp.wait_for("outbox.send", 12)
    assert len(sends) == 12
    assert {(s.trace_id, s.parent_span_id) for s in sends} == {(batch.trace_id, batch.span_id)}
    parents = [r.headers["traceparent"] for r in receiver.seen()]
    assert len(parents) == 12
    assert {p.split("-")[1] for p in parents} == {batch.trace_id}
    assert {p.split("-")[2] for p in parents} == {s.span_id for s in sends}
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT trace_parent FROM batches")).scalar_one()
    assert stored.split("-")[1:3] == [batch.trace_id, batch.span_id]


def test_a_replayed_batch_is_a_span_that_says_so(
    spark: Any, db_url: str, engine: Engine, otlp: OtlpReceiver
) -> None:
    insert_endpoint(engine, "hook")
    effects = spark.createDataFrame(effect_rows(2), EFFECT_SCHEMA)
    results = spark.createDataFrame(invoice_rows(1), INVOICE_SCHEMA)
    sink(db_url).write(results, effects, batch_id="b1")
    sink(db_url).write(results, effects, batch_id="b1")
    batches = otlp.spans("outbox.batch")
    assert [b.attributes["outbox.status"] for b in batches] == ["committed", "replayed"]
    assert len(otlp.spans("outbox.commit")) == 1
