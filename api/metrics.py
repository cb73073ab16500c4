"""Prometheus metrics, read from the database on every scrape.

``/metrics`` is open (no token): it exposes aggregates only (counts, ages, no
keys, recipients or payloads), Prometheus scrapers rarely hold application
tokens, and each scrape costs a few small index-bounded queries (the due rows are
counted in all and per endpoint, each a range of ix_effects_due). Keep the API port
inside the deployment network, as for any metrics endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from spark_outbox.console import health
from spark_outbox.core.endpoint_state import ENDPOINT_STATES, EndpointState, endpoint_states
from spark_outbox.core.queue import OLDEST_DUE_AGE_HELP, QUEUE_DEPTH_HELP, queue


class QueueCollector(Collector):
    """Queue depth by state, the oldest pending age and live workers, at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        with self.engine.begin() as conn:  # a snapshot the queue's figures take stays
            figures = queue(conn)  # read once, for the gauges and each endpoint
            gauges = health.queue_gauges(conn, figures)
            states = endpoint_states(conn, figures)
        yield from _endpoint_families(states)
        depth = GaugeMetricFamily(
            "outbox_effects", "Effects in an unfinished state", labels=["state"]
        )
        for state, n in sorted(gauges.counts.items()):
            depth.add_metric([state], n)
        yield depth
        # The same two figures, names and query as every dispatcher exports.
        yield GaugeMetricFamily("outbox_queue_depth", QUEUE_DEPTH_HELP, value=gauges.queue.depth)
        yield GaugeMetricFamily(
            "outbox_oldest_due_age_seconds",
            OLDEST_DUE_AGE_HELP,
            value=gauges.queue.oldest_due_age_s,
        )
        yield GaugeMetricFamily(
            "outbox_live_workers",
            "Dispatcher workers with a recent heartbeat",
            value=gauges.live_workers,
        )
        yield GaugeMetricFamily(
            "outbox_held_batches",
            "Batches the volume guard holds for an operator",
            value=gauges.held.batches,
        )
        yield GaugeMetricFamily(
            "outbox_held_effects",
            "New effects of the held batches (not claimable until released)",
            value=gauges.held.effects,
        )
        yield GaugeMetricFamily(
            "outbox_recent_payload_mismatches",
            "Stored keys met again with another payload in the last 24 h (by the sink's "
            "batches and by enqueue())",
            value=gauges.mismatches_24h,
        )
        yield GaugeMetricFamily(
            "outbox_recent_expired_effects",
            "Effects whose send-by time (expires_at) passed before they were sent, in the "
            "last 24 h: never sent",
            value=gauges.expired_24h,
        )


def _endpoint_families(states: list[EndpointState]) -> Iterator[Metric]:
    """Per endpoint: its queue, its state (one series per state of ENDPOINT_STATES, 1
    for the one it is in, so a dashboard and alerts select a state by name) and its
    failing streak, from the data the dispatchers' claim obeys."""
    depth = GaugeMetricFamily(
        "outbox_endpoint_queue_depth", f"{QUEUE_DEPTH_HELP}, per endpoint", labels=["endpoint"]
    )
    age = GaugeMetricFamily(
        "outbox_endpoint_oldest_due_age_seconds",
        f"{OLDEST_DUE_AGE_HELP}, per endpoint",
        labels=["endpoint"],
    )
    state = GaugeMetricFamily(
        "outbox_endpoint_state",
        "1 for the state the endpoint is in (what holds it back now), 0 for the others",
        labels=["endpoint", "state"],
    )
    failures = GaugeMetricFamily(
        "outbox_endpoint_failures",
        "The failing streak: failed attempts since the endpoint's last delivery",
        labels=["endpoint"],
    )
    for s in states:
        depth.add_metric([s.name], s.queue.depth)
        age.add_metric([s.name], s.queue.oldest_due_age_s)
        for name in ENDPOINT_STATES:
            state.add_metric([s.name, name], 1 if s.state == name else 0)
        failures.add_metric([s.name], s.failures)
    yield from (depth, age, state, failures)


class ApiMetrics:
    """One registry per app (not the global one), so several apps can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "outbox_api_requests",
            "API requests by route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "outbox_api_request_seconds",
            "API request latency by route template",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )

    def watch_queue(self, engine: Engine) -> None:
        self.registry.register(QueueCollector(engine))

    def observe(self, method: str, route: str, status: int, started: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(time.perf_counter() - started)
