"""/v1/status, /metrics and the support page's chart read no more rows with twice the
history: every statement they run is run again under EXPLAIN ANALYZE, and the rows
its scans of the outbox's tables read are the same with one history as with a
second, older one beside it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from spark_outbox.cli.tools import history, scratch
from spark_outbox.console import health
from spark_outbox.core import counts, db

N = 20_000
HISTORY_TABLES = ("effects", "delivery_attempts", "key_ledger", "batches", "rejects")
CALLS: dict[str, Callable[[Connection], object]] = {
    "status": health.status,
    "queue_gauges": health.queue_gauges,
    "activity": health.activity,
}


@pytest.fixture(scope="module")
def outbox(server_url: str, template_name: str) -> Iterator[Engine]:
    url = scratch.clone_template(server_url, template_name)
    engine = db.create_engine(url, pool_size=2)
    try:
        yield engine
    finally:
        engine.dispose()
        scratch.drop_database(server_url, scratch.database_name(url))


def _load(engine: Engine, first: int, ends_days_ago: int) -> None:
    """N effects in batches of 10 over 30 days, ending ``ends_days_ago`` days ago
    (as many markers as the planner needs to treat batches as history); analysed, folded."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=ends_days_ago)
    history.load(engine, effects=N, days=30, now=now, first=first, per_batch=10, chunk=10_000)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
    with engine.begin() as conn:
        counts.fold(conn)


def _statements(engine: Engine, call: Callable[[Connection], object]) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def note(_c: object, _cur: object, statement: str, parameters: Any, *_: object) -> None:
        seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", note)
    try:
        with engine.connect() as conn:
            call(conn)
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)
    return seen


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if plan.get("Relation Name") in HISTORY_TABLES:
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child)


def _rows_read(engine: Engine, statement: str, parameters: Any) -> int:
    """Rows the statement's scans of the history tables read (kept or filtered out)."""
    with engine.connect() as conn:
        raw = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        found = raw.scalar_one()
        plan = (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]
        conn.rollback()
    return sum(
        (s["Actual Rows"] + s.get("Rows Removed by Filter", 0)) * s["Actual Loops"]
        for s in _scans(plan)
    )


def _reads(engine: Engine) -> dict[tuple[str, int], tuple[str, int]]:
    found = {}
    for name, call in CALLS.items():
        for i, (statement, parameters) in enumerate(_statements(engine, call)):
            found[(name, i)] = (statement.split("\n")[0], _rows_read(engine, statement, parameters))
    return found


def test_status_metrics_and_the_chart_read_no_more_rows_with_twice_the_history(
    outbox: Engine,
) -> None:
    _load(outbox, first=1, ends_days_ago=2)
    one = _reads(outbox)
    _load(outbox, first=N + 1, ends_days_ago=40)  # as much again, older
    two = _reads(outbox)
    assert two == one
    with outbox.connect() as conn:  # and it counts them all, without reading them
        assert sum(health.status(conn).counts.values()) == 2 * N
