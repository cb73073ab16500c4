"""The hot path's statements keep linear plans when the statistics are stale.

The case that happens in production: ``effects`` analyzed while nearly every row
was finished (a long history), then a large batch committed, so ANALYZE has not
yet seen the backlog (autovacuum waits for 10 % of the table to change). Measured
beside a 10,000,000-effect history and a 1,000,000-effect backlog (bench dispatch
--history, auto_explain): each record walked the whole due backlog (1.2 s a
record; fresh effects waited 6-8 s), and each fold of the counts compared every
new row with every other (1.1-1.5 s a fold). Autovacuum is off for these tables
here, so the statistics stay as stale as they were there.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import counts
from spark_outbox.core.settings import DEFAULT_BREAKER
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint


def _autocommit(engine: Engine, sql: str) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text(sql))


def _plan(engine: Engine, statement: sa.TextClause, params: Mapping[str, object]) -> str:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("EXPLAIN " + statement.text), params).scalars().all()
    return "\n".join(rows)


def _history_then_backlog(engine: Engine, history: int, backlog: int) -> None:
    """``history`` delivered effects, analyzed; then ``backlog`` due ones, not."""
    _autocommit(engine, "ALTER TABLE effects SET (autovacuum_enabled = false)")
    insert = (
        "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, state)"
        " SELECT :prefix || lpad(to_hex(g), 63, '0'), 'hook', '{}', 'x', :state"
        " FROM generate_series(1, :n) g"
    )
    with engine.begin() as conn:
        conn.execute(sa.text(insert), {"prefix": "h", "state": "delivered", "n": history})
    _autocommit(engine, "ANALYZE effects")
    with engine.begin() as conn:
        conn.execute(sa.text(insert), {"prefix": "b", "state": "pending", "n": backlog})


def test_record_release_and_start_sends_find_leased_rows_by_id_under_stale_statistics(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "hook")
    _history_then_backlog(engine, history=40_000, backlog=5_000)
    claimed = store.claim(engine, "w1", 250, 30)
    assert len(claimed) == 250
    results = [
        store.Result(
            effect_id=c.id,
            lease_token=c.lease_token,
            attempt=c.attempt,
            outcome="delivered",
            started_at=dt.datetime.now(dt.UTC),
            duration_ms=1.0,
        )
        for c in claimed
    ]
    leases: dict[str, object] = {
        "ids": [c.id for c in claimed],
        "tokens": [c.lease_token for c in claimed],
    }
    record: dict[str, object] = {"worker_id": "w1", "rows": store._rows_json(results)}
    statements: dict[str, Mapping[str, object]] = {
        "record": record | DEFAULT_BREAKER.params(),
        "release": leases | {"delays_s": [0.0] * len(claimed)},
        "start_sends": leases,
    }
    for name, params in statements.items():
        text = _plan(engine, store._Q[name], params)
        assert "ix_effects_due" not in text, f"{name} walks the due range:\n{text}"
        assert "using pk_effects on effects e" in text, f"{name}:\n{text}"
    # The fence still holds in its new form: a lease is recorded once, by its token.
    assert all(store.record(engine, "w1", results).values())
    assert not any(store.record(engine, "w1", results[:3]).values())
    with engine.connect() as conn:
        delivered = conn.execute(
            sa.text("SELECT count(*) FROM effects WHERE state = 'delivered' AND id = ANY(:ids)"),
            {"ids": leases["ids"]},
        ).scalar_one()
    assert delivered == 250


def test_a_fold_deletes_the_rows_it_took_by_address_under_stale_statistics(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "hook")
    _autocommit(engine, "ALTER TABLE effect_counts SET (autovacuum_enabled = false)")
    _autocommit(engine, "ALTER TABLE attempt_counts SET (autovacuum_enabled = false)")
    _autocommit(engine, "ANALYZE effect_counts, attempt_counts")  # nearly empty
    # What 3,000 writes leave: a row per change, folded to one per (endpoint, state).
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effect_counts (endpoint, state, run_id, n)"
                " SELECT 'hook', CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'delivered' END,"
                " NULL, 1 FROM generate_series(1, 3000) g"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO attempt_counts (minute, outcome, n)"
                " SELECT date_trunc('minute', now()), 'delivered', 1"
                " FROM generate_series(1, 3000) g"
            )
        )
    folds: dict[str, Mapping[str, object]] = {"fold": {}, "fold_attempts": {"keep_hours": 1}}
    for name, params in folds.items():
        text = _plan(engine, counts._Q[name], params)
        assert "Tid Scan on" in text and "Materialize" not in text, f"{name}:\n{text}"
    with engine.begin() as conn:
        assert counts.fold(conn) == 6000
    with engine.connect() as conn:
        effect_rows = conn.execute(
            sa.text("SELECT state, n FROM effect_counts ORDER BY state")
        ).all()
        attempt_rows = conn.execute(sa.text("SELECT outcome, n FROM attempt_counts")).all()
    assert [tuple(r) for r in effect_rows] == [("delivered", 1500), ("pending", 1500)]
    assert [tuple(r) for r in attempt_rows] == [("delivered", 3000)]
