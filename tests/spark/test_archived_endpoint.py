"""The Spark sink and an archived endpoint, against real Spark and PostgreSQL: its rows
become rejects whose reason names it and says how to unarchive it; the batch's good
rows commit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.console import lifecycle
from spark_outbox.core.errors import ArchivedEndpoint
from spark_outbox.core.keys import effect_key
from tests.conftest import insert_endpoint
from tests.spark.helpers import sink, table

pytestmark = pytest.mark.spark

SCHEMA = "idempotency_key string, endpoint string, payload string, reject_reason string"


def test_rows_for_an_archived_endpoint_are_rejects_naming_it_and_the_rest_commit(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "hook")
    insert_endpoint(engine, "retired")
    with engine.begin() as conn:
        lifecycle.archive(conn, "retired", actor="olga", reason="receiver retired")
    rows = [
        *((effect_key("a", i), "hook", json.dumps({"n": i}), None) for i in range(3)),
        *((effect_key("a", i), "retired", json.dumps({"n": i}), None) for i in range(3, 5)),
    ]
    out = sink(db_url, results=None).write(None, spark.createDataFrame(rows, SCHEMA), batch_id="b1")
    assert (out.status, out.effects_new, out.rejects) == ("committed", 3, 2)
    reasons = table(engine, "SELECT DISTINCT reason FROM rejects")
    assert [r[0] for r in reasons] == [str(ArchivedEndpoint("retired"))]
    assert "outbox endpoints unarchive retired" in reasons[0][0]
    endpoints_of_effects = table(engine, "SELECT DISTINCT endpoint FROM effects")
    assert [r[0] for r in endpoints_of_effects] == ["hook"]
