"""A reject requeued from a held batch waits with its batch (the volume guard): a
real dispatcher and a real receiver on loopback see nothing of it until an operator
releases the batch, and a cancel of the batch cancels it too."""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.console import holds, rejects
from spark_outbox.core.errors import Conflict, UnknownEndpoint
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker


def _held_batch_with_a_reject(engine: Engine, batch_id: str) -> str:
    """A committed batch the guard held, one of whose rows named an endpoint not
    registered then (the reject as the sink stores it)."""
    key = effect_key(batch_id, 0)
    raw = {"idempotency_key": key, "endpoint": "late", "payload": '{"n": 1}'}
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO batches (job, batch_id, run_id, hold_state, hold_reason)"
                " VALUES ('billing', :b, :run, 'held', 'late: 500 new effects')"
            ),
            {"b": batch_id, "run": uuid.uuid4()},
        )
        conn.execute(
            sa.text(
                "INSERT INTO rejects (job, batch_id, reason, raw_row)"
                " VALUES ('billing', :b, :reason, CAST(:raw AS jsonb))"
            ),
            {"b": batch_id, "reason": str(UnknownEndpoint("late")), "raw": json.dumps(raw)},
        )
    return key


def _requeue(engine: Engine, batch_id: str) -> None:
    with engine.begin() as conn:
        done = rejects.requeue(
            conn, "billing", batch_id, actor="olga", reason="registered late", dry_run=False
        )
    assert done.enqueued == 1


def _state(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.text("SELECT state FROM effects WHERE idempotency_key = :k"), {"k": key}
            ).scalar_one()
        )


def test_a_reject_requeued_from_a_held_batch_is_sent_only_after_release(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    key = _held_batch_with_a_reject(engine, "2026-01-05")
    insert_endpoint(engine, "late", url=receiver.url("/late"))
    _requeue(engine, "2026-01-05")
    assert run_worker(fast, engine) == 0
    assert receiver.seen("/late") == []  # held with its batch
    assert _state(engine, key) == "pending"
    with engine.begin() as conn:
        holds.release(conn, "billing", "2026-01-05", actor="olga", reason="checked", dry_run=False)
    assert run_worker(fast, engine) == 0
    assert receiver.keys("/late") == [key]
    assert _state(engine, key) == "delivered"


def test_a_reject_requeued_from_a_held_batch_is_cancelled_with_it(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    key = _held_batch_with_a_reject(engine, "2026-01-06")
    insert_endpoint(engine, "late", url=receiver.url("/late"))
    _requeue(engine, "2026-01-06")
    with engine.begin() as conn:
        done = holds.cancel(
            conn, "billing", "2026-01-06", actor="olga", reason="wrong data", dry_run=False
        )
    assert done.effects == 1
    assert run_worker(fast, engine) == 0
    assert receiver.seen("/late") == []
    assert _state(engine, key) == "cancelled"


def test_the_rejects_of_a_cancelled_batch_are_not_requeued(engine: Engine) -> None:
    key = _held_batch_with_a_reject(engine, "2026-01-07")
    insert_endpoint(engine, "late")
    with engine.begin() as conn:
        holds.cancel(conn, "billing", "2026-01-07", actor="olga", reason="wrong", dry_run=False)
    with pytest.raises(Conflict, match="was cancelled"), engine.begin() as conn:
        rejects.requeue(conn, "billing", "2026-01-07", actor="olga", reason="r", dry_run=True)
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM effects WHERE idempotency_key = :k"), {"k": key}
        ).scalar_one()
    assert found == 0
