"""/metrics: Prometheus text, queue depth computed from the database at scrape time."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from spark_outbox.dispatch.metrics import Metrics
from tests.api.builders import story
from tests.api.conftest import Tokens


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_expose_the_dispatchers_queue_depth_and_oldest_due_age(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    story(engine)
    client.get("/v1/status", headers=api_tokens.auth("support"))
    response = client.get("/metrics")  # open: see api/metrics.py
    assert response.status_code == 200
    samples = _samples(response.text)
    assert samples[("outbox_effects", (("state", "pending"),))] == 3
    assert samples[("outbox_effects", (("state", "dead"),))] == 1
    assert samples[("outbox_queue_depth", ())] == 3
    assert samples[("outbox_oldest_due_age_seconds", ())] >= 0
    # The same names (and query) as every dispatcher's own /metrics.
    worker_names = {m.name for m in Metrics().registry.collect()}
    assert {"outbox_queue_depth", "outbox_oldest_due_age_seconds"} <= worker_names
    assert samples[("outbox_live_workers", ())] == 1
    key = (
        "outbox_api_requests_total",
        (("method", "GET"), ("route", "/v1/status"), ("status", "200")),
    )
    assert samples[key] == 1
