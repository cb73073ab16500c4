"""enqueue()'s payload mismatches are counted where operators look: /v1/status, the
support page, /metrics (with the sink's), the log; and retention drops old ones."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.dispatch import retention
from tests.api.builders import add_batch
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in

KEY = effect_key("order.created", "order-7")


def _mismatch(engine: Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint="billing-webhook", payload={"total": 10})
    with engine.begin() as conn:
        again = enqueue(
            conn, idempotency_key=KEY, endpoint="billing-webhook", payload={"total": 11}
        )
    assert again.payload_mismatch


def test_an_enqueue_mismatch_is_logged_listed_in_status_and_counted_in_metrics(
    client: TestClient, api_tokens: Tokens, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:  # and one of the sink's, counted beside it
        add_batch(conn, "billing", "b1", [{"name": "x"}], payload_mismatches=2)
    with caplog.at_level(logging.WARNING, logger="spark_outbox.enqueue"):
        _mismatch(engine)
    assert any(
        KEY in r.getMessage() and "first payload stays" in r.getMessage() for r in caplog.records
    )
    body = client.get("/v1/status", headers=api_tokens.auth("support")).json()
    (listed,) = body["enqueue_mismatches"]
    assert listed["idempotency_key"] == KEY and listed["endpoint"] == "billing-webhook"
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(client.get("/metrics").text)
        for s in f.samples
    }
    assert samples["outbox_recent_payload_mismatches"] == 3
    _sign_in(client, api_tokens.support)
    page = client.get("/ui").text
    assert 'id="enqueue-mismatch-line"' in page and KEY[:16] in page


def test_the_same_payload_again_is_no_mismatch_and_retention_drops_old_ones(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint="billing-webhook", payload={"total": 10})
        enqueue(conn, idempotency_key=KEY, endpoint="billing-webhook", payload={"total": 10})
    _mismatch(engine)
    with engine.connect() as conn:
        count = "SELECT count(*) FROM enqueue_mismatches"
        assert conn.execute(sa.text(count)).scalar_one() == 1
    retention.purge(engine, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1), 100)
    with engine.connect() as conn:
        assert conn.execute(sa.text(count)).scalar_one() == 0
    assert (
        client.get("/v1/status", headers=api_tokens.auth("support")).json()["enqueue_mismatches"]
        == []
    )
