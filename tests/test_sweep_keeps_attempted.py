"""The sweeper never deletes an effect that has an attempt (the attempt log has
no foreign key since migration 2001: this rule, not a cascade, keeps it whole)."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.spark import runs
from tests.conftest import insert_endpoint


def _effect(conn: sa.Connection, key: str, run_id: object) -> int:
    return int(
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload,"
                " payload_sha256) VALUES (:k, 'job', 'b1', :run, 'hook', '{}', 'x') RETURNING id"
            ),
            {"k": hashlib.sha256(key.encode()).hexdigest(), "run": run_id},
        ).scalar_one()
    )


def test_a_never_committed_run_is_swept_but_not_an_effect_with_an_attempt(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    run_id = runs.begin_run(engine, "job", "b1")  # a run whose driver never committed
    with engine.begin() as conn:
        attempted = _effect(conn, "attempted", run_id)
        plain = [_effect(conn, f"plain-{i}", run_id) for i in range(3)]
        conn.execute(
            sa.text(
                "INSERT INTO delivery_attempts (effect_id, attempt, worker_id, started_at,"
                " duration_ms, outcome) VALUES (:id, 1, 'w', now(), 1.0, 'retry')"
            ),
            {"id": attempted},
        )
        conn.execute(sa.text("UPDATE batch_runs SET started_at = now() - interval '2 hours'"))
    assert runs.sweep(engine, grace_s=3600) == len(plain)
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT id FROM effects")).scalars().all()
        logged = conn.execute(sa.text("SELECT effect_id FROM delivery_attempts")).scalars().all()
    assert left == [attempted]
    assert logged == [attempted]
