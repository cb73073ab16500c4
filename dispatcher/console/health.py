"""Is it healthy, is anything stuck? The numbers behind ``/v1/status`` and ``/metrics``.

Every figure here is bounded work whatever the history holds: counts by state
come from the kept counts (``spark_outbox.core.counts``), the rest from ranges of
time or from the newest rows (tests/api/test_audit_plans.py proves the plans).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy.engine import Connection, RowMapping

from spark_outbox.console import holds
from spark_outbox.console.audit import from_row
from spark_outbox.core import counts as effect_counts
from spark_outbox.core.endpoint_state import EndpointState, endpoint_states
from spark_outbox.core.queue import Queue, QueueStats, queue
from spark_outbox.core.schema import EFFECT_STATES
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "health.sql")


@dataclasses.dataclass(frozen=True)
class LiveWorker:
    worker_id: str
    hostname: str
    pid: int
    started_at: dt.datetime
    last_seen_at: dt.datetime
    in_flight: int
    delivered: int
    failed: int


@dataclasses.dataclass(frozen=True)
class EndpointHealth:
    name: str
    kind: str
    enabled: bool
    paused_reason: str | None
    paused_at: dt.datetime | None
    last_delivered_at: dt.datetime | None
    # What holds it back now (core/endpoint_state: the budget the claim obeys).
    state: str
    state_reason: str | None
    consecutive_failures: int  # the failing streak, as the breaker counts it
    failing_since: dt.datetime | None
    last_failure: str | None
    resting_until: dt.datetime | None
    in_flight: int
    due_now: int
    oldest_due_age_s: float


@dataclasses.dataclass(frozen=True)
class LastBatch:
    job: str
    batch_id: str
    committed_at: dt.datetime
    effects_new: int
    rejects: int


@dataclasses.dataclass(frozen=True)
class MismatchBatch:
    job: str
    batch_id: str
    committed_at: dt.datetime
    payload_mismatches: int


@dataclasses.dataclass(frozen=True)
class EnqueueMismatch:
    idempotency_key: str
    endpoint: str
    at: dt.datetime


@dataclasses.dataclass(frozen=True)
class Status:
    counts: dict[str, int]
    queue: QueueStats
    delivered_last_5m: int
    delivered_last_1h: int
    live_workers: list[LiveWorker]
    endpoints: list[EndpointHealth]
    last_batches: list[LastBatch]
    held_batches: list[holds.HeldBatch]  # the volume guard's, waiting for an operator
    payload_mismatches: list[MismatchBatch]  # batches of the last 24 h
    enqueue_mismatches: list[EnqueueMismatch]  # enqueue()'s of the last 24 h, newest 20


@dataclasses.dataclass(frozen=True)
class QueueGauges:
    """What /metrics reads on every scrape: cheap, bounded queries only."""

    counts: dict[str, int]
    queue: QueueStats
    live_workers: int
    held: holds.HeldCounts
    mismatches_24h: int
    expired_24h: int  # effects whose send-by time passed unsent, the last 24 h


def status(conn: Connection) -> Status:
    figures = queue(conn)  # read once: the total here, each endpoint's in _endpoints
    counts = dict.fromkeys(EFFECT_STATES, 0)
    counts.update(effect_counts.by_state(conn))
    recent = conn.execute(_Q["recent_deliveries"]).mappings().one()
    return Status(
        counts=counts,
        queue=figures.total,
        delivered_last_5m=recent["last_5m"],
        delivered_last_1h=recent["last_1h"],
        live_workers=[from_row(LiveWorker, r) for r in conn.execute(_Q["live_workers"]).mappings()],
        endpoints=_endpoints(conn, figures),
        last_batches=[
            from_row(LastBatch, r) for r in conn.execute(_Q["last_batch_per_job"]).mappings()
        ],
        held_batches=holds.held_batches(conn),
        payload_mismatches=[
            from_row(MismatchBatch, r) for r in conn.execute(_Q["recent_mismatches"]).mappings()
        ],
        enqueue_mismatches=[
            from_row(EnqueueMismatch, r)
            for r in conn.execute(_Q["recent_enqueue_mismatches"]).mappings()
        ],
    )


def _endpoints(conn: Connection, figures: Queue) -> list[EndpointHealth]:
    """Each endpoint's health, with its state from the data the claim obeys."""
    states = {s.name: s for s in endpoint_states(conn, figures)}
    return [
        _health(r, states[r["name"]])
        for r in conn.execute(_Q["endpoint_health"]).mappings()
        if r["name"] in states  # (one created between the two reads: next time)
    ]


def _health(r: RowMapping, s: EndpointState) -> EndpointHealth:
    return EndpointHealth(
        name=r["name"],
        kind=r["kind"],
        enabled=r["enabled"],
        paused_reason=r["paused_reason"],
        paused_at=r["paused_at"],
        last_delivered_at=r["last_delivered_at"],
        state=s.state,
        state_reason=s.why,
        consecutive_failures=s.failures,
        failing_since=s.failing_since,
        last_failure=s.last_failure,
        resting_until=s.resting_until,
        in_flight=s.in_flight,
        due_now=s.queue.depth,
        oldest_due_age_s=s.queue.oldest_due_age_s,
    )


@dataclasses.dataclass(frozen=True)
class Minute:
    minute: dt.datetime
    delivered: int
    failed: int  # retry, dead or gone


@dataclasses.dataclass(frozen=True)
class Activity:
    """Attempts per minute from ``start`` (inclusive) over ``minutes`` minutes; quiet
    minutes are absent from ``points``."""

    start: dt.datetime
    minutes: int
    points: list[Minute]


MAX_ACTIVITY_HOURS = 24


def activity(conn: Connection, hours: int = 6) -> Activity:
    hours = max(1, min(hours, MAX_ACTIVITY_HOURS))
    end = conn.execute(_Q["this_minute"]).scalar_one()
    points = [
        from_row(Minute, r)
        for r in conn.execute(_Q["attempts_per_minute"], {"hours": hours}).mappings()
    ]
    return Activity(start=end - dt.timedelta(hours=hours), minutes=hours * 60 + 1, points=points)


def queue_gauges(conn: Connection, figures: Queue | None = None) -> QueueGauges:
    gauged = ("pending", "leased", "dead", "uncertain")
    counts = dict.fromkeys(gauged, 0)
    counts.update({s: n for s, n in effect_counts.by_state(conn).items() if s in gauged})
    workers = conn.execute(_Q["live_workers"]).fetchall()
    return QueueGauges(
        counts=counts,
        queue=(figures or queue(conn)).total,
        live_workers=len(workers),
        held=holds.held_counts(conn),
        mismatches_24h=int(conn.execute(_Q["mismatch_total"]).scalar_one()),
        expired_24h=int(conn.execute(_Q["expired_total"]).scalar_one()),
    )
