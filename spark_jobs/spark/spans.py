"""The sink's spans, made on the driver (tracing on only: spark_outbox.core.tracing).

``outbox.batch`` spans one ``write``: job, batch id, run id, the outcome and its
counts. Under it, ``outbox.write`` times the executors' Spark jobs, with one
``outbox.task`` per task that succeeded, and ``outbox.commit`` the one commit
transaction. The executors need no OpenTelemetry: a task reports when it started
and ended (``TaskReport``) and the driver records its span from that (the
executors' clocks, the same as the driver's on one host). The batch span's
context is written with the marker, and every effect of the batch is sent as a
child of it (spark_outbox.dispatch.traces says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from spark_outbox.core import tracing
from spark_outbox.spark.outcome import BatchCounts, BatchOutcome
from spark_outbox.spark.protocol import TaskReport

_COUNTS = tuple(f.name for f in dataclasses.fields(BatchCounts))


@contextlib.contextmanager
def batch(job: str, batch_id: str) -> Iterator[Any]:
    """The batch's span, current inside (None: tracing is off)."""
    with tracing.span("outbox.batch", {"outbox.job": job, "outbox.batch_id": batch_id}) as span:
        yield span


def outcome(span: Any, result: BatchOutcome) -> None:
    """The outcome and its counts on the batch's (or the commit's) span."""
    if span is None:
        return
    span.set_attribute("outbox.status", result.status)
    if result.run_id is not None:
        span.set_attribute("outbox.run_id", result.run_id)
    if result.held_reason is not None:
        span.set_attribute("outbox.held_reason", result.held_reason)
    for name in _COUNTS:
        span.set_attribute(f"outbox.{name}", getattr(result, name))


def run(span: Any, run_id: str) -> None:
    if span is not None:
        span.set_attribute("outbox.run_id", run_id)


def tasks(reports: tuple[TaskReport, ...], kind: str) -> None:
    """One span per task that succeeded, from the times it reported."""
    made_by = tracing.tracer()
    if made_by is None:
        return
    for report in reports:
        if not report.started_at:
            continue  # a report without times (an older executor): no span to draw
        span = made_by.start_span(
            "outbox.task",
            start_time=int(report.started_at * 1e9),
            attributes={
                "outbox.task.kind": kind,
                "outbox.task.id": report.task_id,
                "outbox.task.rows": report.rows,
                "outbox.task.rejects": report.rejects,
                "outbox.task.mismatches": report.mismatches,
                "outbox.task.deferred": report.deferred,
            },
        )
        span.end(end_time=int(max(report.ended_at, report.started_at) * 1e9))
