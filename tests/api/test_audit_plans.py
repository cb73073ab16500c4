"""The audit queries use their indexes (EXPLAIN on a loaded, analysed table)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.bulk import load, recipient_of, reference_of
from spark_outbox.console import audit, health, operations, rejects
from spark_outbox.console.filters import build_filter
from spark_outbox.core import db, queue
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.dispatch import retention, store

AUDIT = queries_beside(audit.__file__, "audit.sql")
HEALTH = queries_beside(health.__file__, "health.sql")
QUEUE = queries_beside(queue.__file__, "queue.sql")
REJECTS = queries_beside(rejects.__file__, "rejects.sql")
RETENTION = queries_beside(retention.__file__, "retention.sql")
OPERATIONS = queries_beside(operations.__file__, "operations.sql")
STORE = queries_beside(store.__file__, "store.sql")
N = 10_000


@pytest.fixture(scope="module")
def loaded(server_url: str, template_name: str) -> Iterator[Connection]:
    """One loaded, analysed database for the module (loading takes seconds; tests only read)."""
    url = scratch.clone_template(server_url, template_name)
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            load(conn, effects=N, attempts=2)
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE"))
            yield conn
    finally:
        engine.dispose()
        scratch.drop_database(server_url, scratch.database_name(url))


def _plan(conn: Connection, query: sa.TextClause, params: dict[str, Any]) -> dict[str, Any]:
    explain = sa.text("EXPLAIN (FORMAT JSON) " + query.text)
    raw = conn.execute(explain, params).scalar_one()
    plan: dict[str, Any] = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return plan


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _indexes(plan: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for n in _nodes(plan) if "Index Name" in n}


def _no_seq_scan_on_big_tables(plan: dict[str, Any]) -> None:
    for node in _nodes(plan):
        if node["Node Type"] == "Seq Scan":
            assert node["Relation Name"] not in ("effects", "delivery_attempts"), node


def _search_params(**filters: Any) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    flt = build_filter(since=now - dt.timedelta(days=30), until=now, **filters)
    return flt.params() | {"limit": 101, "cursor_at": None, "cursor_id": None}


def test_lookup_by_key_uses_the_unique_key_index(loaded: Connection) -> None:
    key = loaded.execute(sa.text("SELECT idempotency_key FROM effects LIMIT 1")).scalar_one()
    plan = _plan(loaded, AUDIT["effect_by_key"], {"key": key})
    assert _indexes(plan) == {"uq_effects_idempotency_key"}
    attempts = _plan(loaded, AUDIT["attempts_of_effect"], {"effect_id": 42, "limit": 500})
    assert _indexes(attempts) == {"ix_delivery_attempts_effect_id_attempt"}
    _no_seq_scan_on_big_tables(attempts)


def test_search_by_recipient_uses_the_recipient_index(loaded: Connection) -> None:
    plan = _plan(loaded, AUDIT["search_effects"], _search_params(recipient=recipient_of(7, N)))
    assert _indexes(plan) == {"ix_effects_recipient_created_at_id"}
    _no_seq_scan_on_big_tables(plan)


def test_search_by_batch_uses_the_batch_index_without_a_sort(loaded: Connection) -> None:
    plan = _plan(loaded, AUDIT["search_effects"], _search_params(job="billing", batch_id="b-3"))
    assert _indexes(plan) == {"ix_effects_job_batch_id_created_at_id"}
    assert "Sort" not in {n["Node Type"] for n in _nodes(plan)}
    counts = _plan(loaded, AUDIT["batch_live_counts"], {"job": "billing", "batch_id": "b-3"})
    assert _indexes(counts) == {"ix_effects_job_batch_id_created_at_id"}


def test_a_later_page_seeks_with_the_cursor_in_the_index(loaded: Connection) -> None:
    params = _search_params(job="billing", batch_id="b-3")
    at = loaded.execute(sa.text("SELECT max(created_at) FROM effects")).scalar_one()
    plan = _plan(loaded, AUDIT["search_effects"], params | {"cursor_at": at, "cursor_id": 2500})
    scan = next(n for n in _nodes(plan) if "Index Name" in n)
    assert "id" in scan.get("Index Cond", "") and "Sort" not in {
        n["Node Type"] for n in _nodes(plan)
    }


def test_search_by_state_and_metrics_gauges_use_indexes(loaded: Connection) -> None:
    plan = _plan(loaded, AUDIT["search_effects"], _search_params(state="dead"))
    assert _indexes(plan) == {"ix_effects_state_created_at_id"}
    _no_seq_scan_on_big_tables(_plan(loaded, QUEUE["queue_stats"], {"cap": 10_000}))
    _no_seq_scan_on_big_tables(_plan(loaded, QUEUE["count_all"], {}))


def test_a_batch_without_a_window_and_its_rejects_page_without_a_sort(loaded: Connection) -> None:
    flt = build_filter(since=None, until=None, job="billing", batch_id="b-3")
    params = flt.params() | {"limit": 101, "cursor_at": None, "cursor_id": None}
    plan = _plan(loaded, AUDIT["search_effects"], params)
    assert _indexes(plan) == {"ix_effects_job_batch_id_created_at_id"}
    assert "Sort" not in {n["Node Type"] for n in _nodes(plan)}
    loaded.execute(
        sa.text(
            "INSERT INTO rejects (job, batch_id, reason, raw_row) "
            "SELECT 'billing', 'b-' || (i % 50), 'r', '{}' FROM generate_series(1, 20000) i"
        )
    )
    loaded.commit()
    loaded.execute(sa.text("ANALYZE rejects"))
    page = {"job": "billing", "batch_id": "b-3", "before_id": None, "limit": 101}
    plan = _plan(loaded, REJECTS["rejects_of_batch"], page)
    assert _indexes(plan) == {"ix_rejects_job_batch_id_id"}
    assert "Sort" not in {n["Node Type"] for n in _nodes(plan)}


def test_search_by_reference_uses_the_reference_index(loaded: Connection) -> None:
    plan = _plan(loaded, AUDIT["search_effects"], _search_params(reference=reference_of(7)))
    assert _indexes(plan) == {"ix_effects_reference_created_at_id"}
    _no_seq_scan_on_big_tables(plan)


def test_retention_and_recover_read_through_their_indexes(loaded: Connection) -> None:
    now = dt.datetime.now(dt.UTC)
    start = {"bound": now, "batch_size": 100, "after_at": dt.datetime.min, "after_id": -1}
    purge = _plan(loaded, retention.STATEMENTS["purge_batch"], start)
    # The batch is found through the purgeable index, never by scanning effects; its
    # attempts by effect_id (a nested loop at 100k+ effects; at this test's size the
    # planner may hash the small attempts table instead).
    assert "ix_effects_purgeable" in _indexes(purge)
    for node in _nodes(purge):
        assert (node["Node Type"], node.get("Relation Name")) != ("Seq Scan", "effects")
    expired = _plan(loaded, retention.STATEMENTS["purge_expired"], start)  # a range of its own
    assert "ix_effects_expired" in _indexes(expired)
    for node in _nodes(expired):
        assert (node["Node Type"], node.get("Relation Name")) != ("Seq Scan", "effects")
    stubs = _plan(loaded, RETENTION["purge_stubs"], start)
    assert "ix_effects_stubs" in _indexes(stubs)
    loaded.execute(  # the ledger as the record statements of the history filled it
        sa.text(
            "INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at,"
            " finished_at)"
            " SELECT idempotency_key, endpoint, payload_sha256, updated_at, updated_at FROM effects"
            " WHERE state = 'delivered' ON CONFLICT DO NOTHING"
        )
    )
    loaded.commit()
    loaded.execute(sa.text("ANALYZE key_ledger"))
    later = now + dt.timedelta(days=1)  # the ledger's keys finished at its fill (now())
    forget: dict[str, Any] = {"bound": later, "batch_size": 100, "after_at": dt.datetime.min}
    edge = _plan(loaded, RETENTION["forget_keys_edge"], forget)
    assert "ix_key_ledger_finished_at" in _indexes(edge)
    forget["edge"] = loaded.execute(RETENTION["forget_keys_edge"], forget).scalar_one()
    assert forget["edge"] is not None
    # A batch's keys found by their finish times and planned as a batch: planned as a
    # third of the ledger (the edge a CTE's result), each batch scanned the ledger and
    # hashed every effect (16 s a batch at 10M effects).
    batch = _plan(loaded, RETENTION["forget_keys"], forget)
    by_finish = [n for n in _nodes(batch) if "finished_at" in str(n.get("Filter", ""))]
    by_finish += [n for n in _nodes(batch) if n.get("Index Name") == "ix_key_ledger_finished_at"]
    assert by_finish and all(n["Node Type"] == "Index Scan" for n in by_finish), by_finish
    in_batch = loaded.execute(
        sa.text("SELECT count(*) FROM key_ledger WHERE finished_at <= :edge"), forget
    ).scalar_one()
    assert all(n["Plan Rows"] <= 2 * in_batch for n in by_finish), (in_batch, by_finish)
    recover = _plan(
        loaded,
        OPERATIONS["count_dead_of_endpoint"],
        {"endpoint": "billing-webhook", "since": now, "cap_plus_one": 1001},
    )
    assert _indexes(recover) == {"ix_effects_dead_endpoint_updated_at"}


def test_the_expiry_pass_reads_only_effects_with_a_send_by_time(loaded: Connection) -> None:
    plan = _plan(loaded, STORE["expire_due"], {"limit": 1000})
    assert "ix_effects_expiring" in _indexes(plan)
    for node in _nodes(plan):
        assert (node["Node Type"], node.get("Relation Name")) != ("Seq Scan", "effects")
