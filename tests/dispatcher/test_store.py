"""The store's SQL on a real PostgreSQL: claim, record (fenced), release, the ledger."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.endpoints import pause
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.dispatch import store
from spark_outbox.spark.runs import engine_for
from tests.conftest import insert_endpoint


def _enqueue(engine: Engine, n: int, endpoint: str = "hook") -> list[str]:
    keys = []
    with engine.begin() as conn:
        for i in range(n):
            key = effect_key("test", i)
            enqueue(conn, idempotency_key=key, endpoint=endpoint, payload={"i": i})
            keys.append(key)
    return keys


def _state(engine: Engine, key: str) -> dict[str, object]:
    with engine.connect() as conn:
        row = (
            conn.execute(sa.text("SELECT * FROM effects WHERE idempotency_key = :k"), {"k": key})
            .mappings()
            .one()
        )
    return dict(row)


def _result(c: store.Claimed, outcome: str, **kw: object) -> store.Result:
    return store.Result(
        effect_id=c.id,
        lease_token=c.lease_token,
        attempt=c.attempt,
        outcome=outcome,
        started_at=dt.datetime.now(dt.UTC),
        duration_ms=1.0,
        **kw,  # type: ignore[arg-type]
    )


def test_claim_leases_due_effects_once(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    _enqueue(engine, 5)
    first = store.claim(engine, "w1", 3, 30)
    second = store.claim(engine, "w2", 10, 30)
    assert len(first) == 3 and len(second) == 2
    assert not {c.id for c in first} & {c.id for c in second}
    assert store.claim(engine, "w3", 10, 30) == []
    row = _state(engine, first[0].idempotency_key)
    assert row["state"] == "leased" and row["attempt_count"] == 1 and row["lease_owner"] == "w1"
    assert row["next_attempt_at"] == row["lease_expires_at"]
    assert json.loads(first[0].payload)["i"] in range(5)


def test_an_expired_lease_is_claimed_again_with_a_new_token(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    _enqueue(engine, 1)
    (old,) = store.claim(engine, "w1", 10, 0.05)
    import time

    time.sleep(0.1)
    (new,) = store.claim(engine, "w2", 10, 30)
    assert new.id == old.id and new.lease_token != old.lease_token and new.attempt == 2


def test_a_stale_token_changes_nothing_and_is_logged_stale(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    (key,) = _enqueue(engine, 1)
    (old,) = store.claim(engine, "w1", 10, 0.01)
    import time

    time.sleep(0.05)
    (new,) = store.claim(engine, "w2", 10, 30)
    assert store.record(engine, "w1", [_result(old, "dead", error="zombie")]) == {
        (old.id, old.lease_token): False
    }
    assert _state(engine, key)["state"] == "leased"
    assert store.record(engine, "w2", [_result(new, "delivered", status_code=200)]) == {
        (new.id, new.lease_token): True
    }
    with engine.connect() as conn:
        outcomes = conn.execute(
            sa.text("SELECT worker_id, outcome FROM delivery_attempts ORDER BY id")
        ).all()
    assert [tuple(r) for r in outcomes] == [("w1", "stale"), ("w2", "delivered")]
    assert _state(engine, key)["state"] == "delivered"


def test_a_delivery_writes_no_ledger_row_and_a_retry_reschedules(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    keys = _enqueue(engine, 2)
    a, b = store.claim(engine, "w1", 10, 30)
    recorded = store.record(
        engine,
        "w1",
        [_result(a, "delivered", status_code=200), _result(b, "retry", delay_s=300, error="500")],
    )
    assert recorded == {(a.id, a.lease_token): True, (b.id, b.lease_token): True}
    with engine.connect() as conn:  # the row keeps the key while it is there
        assert conn.execute(sa.text("SELECT count(*) FROM key_ledger")).scalar_one() == 0
    assert _state(engine, a.idempotency_key)["state"] == "delivered"
    retried = _state(engine, b.idempotency_key)
    assert retried["state"] == "pending" and retried["lease_token"] is None
    assert retried["last_error"] == "500"
    assert retried["next_attempt_at"] > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=250)
    assert set(keys) == {a.idempotency_key, b.idempotency_key}


def test_deleting_a_delivered_effect_keeps_its_key_so_it_is_never_enqueued_again(
    engine: Engine,
) -> None:
    """Whoever deletes the row (here a bare DELETE, as an operator might), the
    finished key enters the ledger with how and when it finished; an unfinished
    one (the retried effect) does not."""
    insert_endpoint(engine, "hook")
    _enqueue(engine, 2)
    a, b = store.claim(engine, "w1", 10, 30)
    store.record(engine, "w1", [_result(a, "delivered", status_code=200), _result(b, "retry")])
    delivered_at = _state(engine, a.idempotency_key)["delivered_at"]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM effects"))
    with engine.connect() as conn:
        ledger = conn.execute(
            sa.text("SELECT idempotency_key, state, delivered_at FROM key_ledger")
        ).all()
    assert [tuple(r) for r in ledger] == [(a.idempotency_key, "delivered", delivered_at)]
    with engine.begin() as conn:
        again = enqueue(conn, idempotency_key=a.idempotency_key, endpoint="hook", payload={"i": 0})
        fresh = enqueue(conn, idempotency_key=b.idempotency_key, endpoint="hook", payload={"i": 1})
    assert (again.new, fresh.new) == (False, True)
    assert [c.idempotency_key for c in store.claim(engine, "w1", 10, 30)] == [b.idempotency_key]


def test_gone_kills_the_effect_and_pauses_the_endpoint(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    _enqueue(engine, 2)
    a, _ = store.claim(engine, "w1", 10, 30)
    store.record(engine, "w1", [_result(a, "gone", status_code=410, error="410 Gone")])
    assert _state(engine, a.idempotency_key)["state"] == "dead"
    with engine.connect() as conn:
        ep = conn.execute(sa.text("SELECT enabled, paused_reason FROM endpoints")).one()
    assert ep == (False, "410 Gone")


def test_a_pause_by_a_410_is_audited_as_the_systems_action(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    _enqueue(engine, 2)
    a, b = store.claim(engine, "w1", 10, 30)
    store.record(engine, "w1", [_result(a, "gone", status_code=410, error="410 Gone")])
    store.record(engine, "w1", [_result(b, "gone", status_code=410, error="410 Gone")])
    with engine.connect() as conn:
        audited = conn.execute(
            sa.text("SELECT actor, action, target, reason FROM operator_actions")
        ).all()
    # Once: the second 410 finds the endpoint paused already.
    assert [tuple(row) for row in audited] == [("system", "pause_endpoint", "hook", "410 Gone")]


RUN = "00000000-0000-0000-0000-0000000000b1"


def test_a_paused_endpoint_and_an_uncommitted_batch_are_not_claimed(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    insert_endpoint(engine, "other")
    _enqueue(engine, 1)
    with engine.begin() as conn:
        pause(conn, "hook", "maintenance")
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload,"
                " payload_sha256) VALUES (:k, 'j', 'b1', :run, 'other', '{}', 'x')"
            ),
            {"k": "f" * 64, "run": RUN},
        )
    assert store.claim(engine, "w1", 10, 30) == []
    with engine.begin() as conn:  # another run's marker for the batch shows nothing
        conn.execute(
            sa.text(
                "INSERT INTO batches (job, batch_id, run_id) VALUES ('j', 'b0', gen_random_uuid())"
            )
        )
    assert store.claim(engine, "w1", 10, 30) == []
    with engine.begin() as conn:  # the run's own marker makes its effects visible
        conn.execute(
            sa.text("INSERT INTO batches (job, batch_id, run_id) VALUES ('j', 'b1', :run)"),
            {"run": RUN},
        )
    assert [c.idempotency_key for c in store.claim(engine, "w1", 10, 30)] == ["f" * 64]


def test_a_key_in_the_ledger_is_settled_without_sending(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    (key,) = _enqueue(engine, 1)
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO key_ledger VALUES (:k, 'hook', 'x', now() - interval '1 day')"),
            {"k": key},
        )
    assert store.claim(engine, "w1", 10, 30) == []
    row = _state(engine, key)
    assert row["state"] == "delivered" and row["attempt_count"] == 0
    assert "key ledger" in str(row["last_error"])


def test_release_hands_back_unsent_leases(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    (key,) = _enqueue(engine, 1)
    (c,) = store.claim(engine, "w1", 10, 30)
    assert store.release(engine, [store.Release(c.id, c.lease_token)]) == 1
    row = _state(engine, key)
    assert row["state"] == "pending" and row["attempt_count"] == 0 and row["lease_owner"] is None
    assert [x.idempotency_key for x in store.claim(engine, "w2", 10, 30)] == [key]


def test_the_claim_walks_the_due_index_in_order(engine: Engine, db_url: str) -> None:
    insert_endpoint(engine, "hook")
    _enqueue(engine, 50)
    with engine.begin() as conn:
        # A realistic outbox is mostly finished rows; the partial index skips them.
        # No ANALYZE: right after a batch commit the statistics are stale too.
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, state)"
                " SELECT lpad(to_hex(g), 64, '0'), 'hook', '{}', 'x', 'delivered'"
                " FROM generate_series(1, 20000) g"
            )
        )
    dispatcher_engine = db.create_engine(db_url, **store.ENGINE_OPTIONS)
    with dispatcher_engine.connect() as conn:
        plan = (
            conn.execute(
                sa.text("EXPLAIN " + store._Q["claim"].text),
                {"worker_id": "w", "limit": 10, "lease_s": 30, "window": store.CLAIM_WINDOW},
            )
            .scalars()
            .all()
        )
    dispatcher_engine.dispose()
    text = "\n".join(plan)
    assert "Index Scan using ix_effects_due on effects" in text, text
    # The sorts are of the endpoints (a random turn order), of the rows already
    # taken (each endpoint's share, into rounds) and of an ordered endpoint's window
    # (its keys' earliest), never of an endpoint's due range.
    sort_keys = sorted(line.strip() for line in plan if "Sort Key" in line)
    assert sort_keys == [
        "Sort Key: (COALESCE(w.ordering_key, (w.id)::text)), w.created_at, w.id",
        "Sort Key: (random())",
        "Sort Key: (row_number() OVER (?))",
        "Sort Key: k.next_attempt_at",
        "Sort Key: t.endpoint",
    ], text
    assert "Seq Scan on effects" not in text, text


def test_an_old_and_a_new_lease_in_one_batch_record_only_the_new(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    (key,) = _enqueue(engine, 1)
    (old,) = store.claim(engine, "w1", 10, 0.01)
    import time

    time.sleep(0.05)
    (new,) = store.claim(engine, "w1", 10, 30)
    recorded = store.record(
        engine, "w1", [_result(old, "dead", error="late"), _result(new, "delivered")]
    )
    assert recorded == {(old.id, old.lease_token): False, (new.id, new.lease_token): True}
    with engine.connect() as conn:
        outcomes = (
            conn.execute(sa.text("SELECT outcome FROM delivery_attempts ORDER BY attempt"))
            .scalars()
            .all()
        )
    assert outcomes == ["stale", "delivered"]
    assert _state(engine, key)["state"] == "delivered"


@pytest.mark.parametrize("make_engine", [db.create_engine, engine_for])
def test_a_failing_statement_never_shows_its_values(
    db_url: str, make_engine: Callable[[str], Engine]
) -> None:
    """Every engine the project creates keeps bound values out of its errors: neither
    SQLAlchemy's parameter listing, nor libpq's quote of the statement around the error
    position, nor the server's "Failing row contains (...)" (endpoint rows hold signing
    secrets and SMTP passwords, effects hold payloads)."""
    secret = "whsec_do-not-print-me"
    failing = [
        "SELECT CAST(:secret AS text) FROM no_such_table",
        "INSERT INTO endpoints (name, kind, signing_secret, timeout_s) "
        "VALUES ('hook', 'webhook', :secret, 0)",
    ]
    engine = make_engine(db_url)
    try:
        for statement in failing:
            with pytest.raises(sa.exc.DBAPIError) as info, engine.connect() as conn:
                conn.execute(sa.text(statement), {"secret": secret})
            assert secret not in str(info.value), statement
            assert "hide_parameters=True" in str(info.value)
    finally:
        engine.dispose()
