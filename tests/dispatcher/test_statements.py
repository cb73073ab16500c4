"""The store's plan-cache policy (``store.Statements``), on a real PostgreSQL.

The worker and the recorder only call ``Statements.claim`` and ``.record``; what
is prepared, at which claim sizes, once per connection, is decided there, from
the settings. Observed where PostgreSQL keeps it: ``pg_prepared_statements``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint


def _engine(db_url: str) -> Engine:
    """The dispatcher's engine options on a pool of one: every call, the same session."""
    return db.create_engine(db_url, pool_size=1, **store.ENGINE_OPTIONS)


@pytest.fixture
def sessions(db_url: str) -> Iterator[tuple[Engine, Engine]]:
    """Two dispatcher sessions on one database."""
    first, second = _engine(db_url), _engine(db_url)
    insert_endpoint(first, "hook")
    yield first, second
    first.dispose()
    second.dispose()


@pytest.fixture(autouse=True)
def plans_outlive_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's 1-s life must not end mid-test on a slow machine (prepare_time is
    compared below; the refresh has its own test in test_prepared.py)."""
    real = store._claim_statement
    monkeypatch.setattr(
        store, "_claim_statement", lambda n: dataclasses.replace(real(n), max_age_s=3600.0)
    )
    monkeypatch.setattr(store, "_RECORD", dataclasses.replace(store._RECORD, max_age_s=3600.0))


def _due(engine: Engine, n: int, start: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT lpad(to_hex(g), 64, '0'), 'hook', '{\"i\": 1}', 'x'"
                " FROM generate_series(:a, :b) g"
            ),
            {"a": start + 1, "b": start + n},
        )


def _prepared(engine: Engine) -> dict[str, tuple[object, int]]:
    """name -> (prepare_time, executions) of the statements prepared on the session."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT name, prepare_time, generic_plans + custom_plans FROM pg_prepared_statements"
        ).all()
    return {name: (at, runs) for name, at, runs in rows}


def test_the_store_prepares_each_claim_size_once_per_connection(
    sessions: tuple[Engine, Engine],
) -> None:
    engine, other = sessions
    statements = store.Statements.from_settings(
        Settings.from_env(env={"OUTBOX_CLAIM_BATCH_SIZE": "16"})
    )
    # Nothing claimed before the first claim: short, so prepared, at the batch size.
    assert statements.claim(engine, "w", 16, 30) == store.Claim([], full=False)
    first = _prepared(engine)
    assert first.keys() == {"outbox_claim_16"}
    # Short again: room rounded down to its size bucket (eighths of 16: steps of 2).
    assert statements.claim(engine, "w", 13, 30).effects == []
    assert statements.claim(engine, "w", 12, 30).effects == []
    assert statements.claim(engine, "w", 16, 30).effects == []
    assert statements.claim(engine, "w", 1, 30).effects == []
    now = _prepared(engine)
    assert now.keys() == {"outbox_claim_16", "outbox_claim_12", "outbox_claim_1"}
    assert now["outbox_claim_16"] == (first["outbox_claim_16"][0], 2)  # prepared once, run twice
    assert now["outbox_claim_12"][1] == 2 and now["outbox_claim_1"][1] == 1
    # A claim that fills its bucket is full (the worker claims again at once)...
    _due(engine, 40, 0)
    claim = statements.claim(engine, "w", 13, 30)
    assert len(claim.effects) == 12 and claim.full
    assert _prepared(engine)["outbox_claim_12"][1] == 3
    # ... and is not short: the next claim is planned, at the full room, nothing prepared.
    claim = statements.claim(engine, "w", 13, 30)
    assert len(claim.effects) == 13 and claim.full
    assert _prepared(engine).keys() == now.keys()
    # Another connection prepares its own, once it claims prepared (after a short claim).
    rest = statements.claim(other, "w", 16, 30)
    assert len(rest.effects) == 15 and not rest.full
    assert statements.claim(other, "w", 16, 30) == store.Claim([], full=False)
    assert _prepared(other) == {}  # both planned: 15 of 16 was not short
    assert statements.claim(other, "w", 16, 30) == store.Claim([], full=False)
    assert _prepared(other).keys() == {"outbox_claim_16"}
    # Every record is prepared, once per connection.
    at = dt.datetime.now(dt.UTC)
    for c in rest.effects[:2]:
        result = store.Result(c.id, c.lease_token, c.attempt, "delivered", at, 1.0)
        assert statements.record(other, "w", [result]) == {(c.id, c.lease_token): True}
    assert _prepared(other)["outbox_record"][1] == 2


def test_with_preparation_off_nothing_is_prepared_and_claims_take_their_room(
    sessions: tuple[Engine, Engine],
) -> None:
    """OUTBOX_PREPARED_STATEMENTS=0, for a PgBouncer in transaction pooling mode
    (a prepared statement may not be on the server connection that runs it)."""
    engine, _ = sessions
    statements = store.Statements.from_settings(
        Settings.from_env(env={"OUTBOX_PREPARED_STATEMENTS": "0", "OUTBOX_CLAIM_BATCH_SIZE": "16"})
    )
    assert statements.claim(engine, "w", 13, 30) == store.Claim([], full=False)
    _due(engine, 20, 0)
    claim = statements.claim(engine, "w", 13, 30)  # after a short claim: 13, not 12
    assert len(claim.effects) == 13 and claim.full
    at = dt.datetime.now(dt.UTC)
    results = [
        store.Result(c.id, c.lease_token, c.attempt, "delivered", at, 1.0) for c in claim.effects
    ]
    assert all(statements.record(engine, "w", results).values())
    assert len(statements.claim(engine, "w", 16, 30).effects) == 7
    assert _prepared(engine) == {}
