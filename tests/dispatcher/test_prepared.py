"""The claim and the record as statements prepared once per connection, on a real
PostgreSQL.

Why it exists (dispatcher/dispatch/prepared.py): planning was ~70 % of a small claim's
cost. The traps it avoids are asserted here: a LIMIT left as a parameter gives a
generic plan that scans the whole outbox; a statement gone from the server (a
``DISCARD ALL``) must be prepared again, not fail the claim or the record; the
prepared record (its parameters declared text and cast by the statement) must
write exactly what the planned one writes, whatever the values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import prepared, store
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker


@pytest.fixture
def one_connection(db_url: str) -> Iterator[Engine]:
    """The dispatcher's engine options on a pool of one: every call, the same session."""
    eng = db.create_engine(db_url, pool_size=1, **store.ENGINE_OPTIONS)
    yield eng
    eng.dispose()


def _due(engine: Engine, n: int, start: int = 0) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT lpad(to_hex(g), 64, '0'), 'hook', '{\"i\": 1}', 'x'"
                " FROM generate_series(:a, :b) g"
            ),
            {"a": start + 1, "b": start + n},
        )


def _statements(conn: sa.Connection) -> dict[str, tuple[int, int]]:
    rows = conn.exec_driver_sql(
        "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
    ).all()
    return {name: (generic, custom) for name, generic, custom in rows}


def test_the_claim_is_prepared_once_and_runs_its_generic_plan(
    one_connection: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan's 1-s life must not end mid-test on a slow machine (its own test below).
    real = store._claim_statement
    monkeypatch.setattr(
        store, "_claim_statement", lambda n: dataclasses.replace(real(n), max_age_s=3600.0)
    )
    insert_endpoint(one_connection, "hook")
    _due(one_connection, 40)
    for _ in range(8):
        assert len(store.claim(one_connection, "w", 4, 30, prepared=True)) == 4
    with one_connection.connect() as conn:
        generic, custom = _statements(conn)["outbox_claim_4"]
    # PostgreSQL plans the first five executions, then keeps the generic plan.
    assert custom == 5 and generic == 3


def test_unprepared_claims_leave_nothing_prepared(one_connection: Engine) -> None:
    insert_endpoint(one_connection, "hook")
    _due(one_connection, 10)
    assert len(store.claim(one_connection, "w", 4, 30, prepared=False)) == 4
    with one_connection.connect() as conn:
        assert _statements(conn) == {}


def test_the_generic_plan_never_reads_the_whole_outbox(one_connection: Engine) -> None:
    """With LIMIT as a parameter the generic plan guessed 10 % of the table and
    hash-joined a sequential scan of effects (7.7 ms vs 0.5 ms at 30,000 due)."""
    insert_endpoint(one_connection, "hook")
    _due(one_connection, 30000)
    with one_connection.connect() as conn:
        conn.exec_driver_sql("ANALYZE effects")
    store.claim(one_connection, "w", 8, 30, prepared=True)
    with one_connection.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        plan = "\n".join(
            row[0] for row in conn.exec_driver_sql("EXPLAIN EXECUTE outbox_claim_8 ('w', 30)")
        )
        conn.exec_driver_sql("RESET plan_cache_mode")
    assert "Seq Scan on effects" not in plan, plan


def test_a_statement_gone_from_the_server_is_prepared_again(one_connection: Engine) -> None:
    insert_endpoint(one_connection, "hook")
    _due(one_connection, 10)
    assert len(store.claim(one_connection, "w", 2, 30, prepared=True)) == 2
    with one_connection.connect() as conn:
        conn.exec_driver_sql("DISCARD ALL")  # what a pooler's server reset does
    assert len(store.claim(one_connection, "w", 2, 30, prepared=True)) == 2
    with one_connection.connect() as conn:
        assert "outbox_claim_2" in _statements(conn)


def _claimed(engine: Engine, prefix: str, n: int) -> list[store.Claimed]:
    """``n`` new effects, claimed; earlier ones (retried, paused) left out of the way."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE effects SET next_attempt_at = 'infinity' WHERE state = 'pending';"
            "UPDATE endpoints SET enabled = true;"
            "UPDATE endpoint_budgets SET failures = 0, failing_since = NULL, resting_until = NULL"
        )
        for i in range(n):
            enqueue(conn, idempotency_key=effect_key(prefix, i), endpoint="hook", payload={"i": i})
    got = store.claim(engine, "w", 1000, 30)
    assert len(got) == n
    return sorted(got, key=lambda c: c.idempotency_key)


def test_a_lost_record_statement_is_prepared_again_and_its_transaction_run_once_more(
    one_connection: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan's 1-s life must not end between the two records on a slow machine: the
    # second would then be prepared afresh and never meet the lost statement.
    monkeypatch.setattr(store, "_RECORD", dataclasses.replace(store._RECORD, max_age_s=3600.0))
    insert_endpoint(one_connection, "hook")
    first, second = _claimed(one_connection, "lost", 2)
    at = dt.datetime.now(dt.UTC)
    ok = store.Result(first.id, first.lease_token, 1, "delivered", at, 1.0)
    assert store.record(one_connection, "w", [ok], prepared=True) == {
        (first.id, first.lease_token): True
    }
    with one_connection.connect() as conn:
        assert "outbox_record" in _statements(conn)
        conn.exec_driver_sql("DISCARD ALL")  # what a pooler's server reset does
    ok2 = dataclasses.replace(ok, effect_id=second.id, lease_token=second.lease_token)
    assert store.record(one_connection, "w", [ok2], prepared=True) == {
        (second.id, second.lease_token): True
    }
    with one_connection.connect() as conn:
        attempts = conn.exec_driver_sql(
            "SELECT effect_id, count(*) FROM delivery_attempts GROUP BY 1 ORDER BY 1"
        ).all()
        keys = conn.exec_driver_sql(
            "SELECT count(*) FROM effects WHERE state = 'delivered'"
        ).scalar_one()
    assert attempts == sorted([(first.id, 1), (second.id, 1)]) and keys == 2  # each once


_TEXT = st.none() | st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
_OUTCOME = st.fixed_dictionaries(
    {
        "outcome": st.sampled_from(["delivered", "retry", "dead", "gone", "uncertain"]),
        "delay_s": st.sampled_from([0.0, 0.1, 1.5, 3600.0, 1e-7]),
        "error": _TEXT,
        "status_code": st.none() | st.integers(100, 599),
        "error_class": _TEXT,
        "response_excerpt": _TEXT,
        "duration_ms": st.floats(0, 1e9, allow_nan=False),
        "stale": st.booleans(),
    }
)
_runs = itertools.count()


@settings(
    max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(outcomes=st.lists(_OUTCOME, min_size=1, max_size=6))
def test_the_prepared_record_writes_what_the_planned_one_writes(
    one_connection: Engine, outcomes: list[dict[str, Any]]
) -> None:
    """The same outcomes, recorded for two sets of effects, one set prepared and one
    planned: effects, attempts and the ledger rows their deletion leaves alike (rows
    in key order, as the outcomes were dealt; times compared to the row's own
    updated_at: each statement has its own now())."""
    run = next(_runs)
    with one_connection.connect() as conn:  # once per database (examples share it)
        registered = conn.exec_driver_sql("SELECT count(*) FROM endpoints").scalar_one()
    if not registered:
        insert_endpoint(one_connection, "hook")
    written = {}
    for prepared_, name in ((True, "p"), (False, "u")):
        claimed = _claimed(one_connection, f"{name}{run}", len(outcomes))
        at = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
        results = [
            store.Result(
                effect_id=c.id,
                lease_token="00000000-0000-4000-8000-000000000000" if o["stale"] else c.lease_token,
                attempt=c.attempt,
                started_at=at,
                **{k: v for k, v in o.items() if k != "stale"},
            )
            for c, o in zip(claimed, outcomes, strict=True)
        ]
        fresh = store.record(one_connection, "w", results, prepared=prepared_)
        ids = [c.id for c in claimed]
        with one_connection.connect() as conn:
            effects = conn.execute(
                sa.text(
                    "SELECT state, last_error, attempt_count, lease_token IS NULL,"
                    " CASE WHEN state = 'pending' THEN next_attempt_at - updated_at END,"
                    " delivered_at - updated_at"
                    " FROM effects WHERE id = ANY(:ids) ORDER BY idempotency_key"
                ),
                {"ids": ids},
            ).all()
            attempts = conn.execute(
                sa.text(
                    "SELECT a.attempt, a.worker_id, a.started_at, a.duration_ms, a.outcome,"
                    " a.status_code, a.error_class, a.error, a.response_excerpt"
                    " FROM delivery_attempts a JOIN effects e ON e.id = a.effect_id"
                    " WHERE a.effect_id = ANY(:ids) ORDER BY e.idempotency_key"
                ),
                {"ids": ids},
            ).all()
        # A delivery writes no ledger row; the keys its finish leaves in the ledger
        # once the rows are deleted (as a purge does: ledger.sql) are compared instead.
        keys = sorted(c.idempotency_key for c in claimed)
        with one_connection.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM delivery_attempts WHERE effect_id = ANY(:ids)"), {"ids": ids}
            )
            conn.execute(sa.text("DELETE FROM effects WHERE id = ANY(:ids)"), {"ids": ids})
            ledger = conn.execute(
                sa.text(
                    "SELECT state, delivered_at IS NOT NULL FROM key_ledger"
                    " WHERE idempotency_key = ANY(:keys) ORDER BY idempotency_key"
                ),
                {"keys": keys},
            ).all()
        finished = [e for e in effects if e[0] in ("delivered", "dead", "cancelled", "expired")]
        assert len(ledger) == len(finished)  # a key per finished effect, none for the others
        written[name] = (effects, attempts, ledger, sorted(fresh.values()))
    assert written["p"] == written["u"]


def test_an_old_plan_is_prepared_afresh(one_connection: Engine) -> None:
    statement = prepared.Statement("probe_age", "SELECT CAST(:x AS int) + 1", {"x": "int"}, 0.05)

    def prepared_at(conn: sa.Connection) -> object:
        sql = "SELECT prepare_time FROM pg_prepared_statements WHERE name = 'probe_age'"
        return conn.exec_driver_sql(sql).scalar_one()

    with one_connection.connect() as conn:
        assert prepared.execute(conn, statement, {"x": 1}).scalar_one() == 2
        first = prepared_at(conn)
        assert prepared.execute(conn, statement, {"x": 2}).scalar_one() == 3
        assert prepared_at(conn) == first
        time.sleep(0.1)
        assert prepared.execute(conn, statement, {"x": 3}).scalar_one() == 4
        assert prepared_at(conn) != first


def test_a_connection_holds_a_bounded_number_of_statements(one_connection: Engine) -> None:
    with one_connection.connect() as conn:
        for i in range(prepared._MAX_PER_CONNECTION + 3):
            statement = prepared.Statement(f"probe_cap_{i}", f"SELECT {i} + :x", {"x": "int"})
            assert prepared.execute(conn, statement, {"x": 1}).scalar_one() == i + 1
            assert len(_statements(conn)) <= prepared._MAX_PER_CONNECTION
        assert "probe_cap_34" in _statements(conn)


def test_parameters_keep_their_order_of_first_use() -> None:
    statement = prepared.Statement(
        "probe_order",
        "SELECT :b, :a, CAST(:b AS text) || '::x', 'a:b', x::int",
        {"a": "int", "b": "text"},
    )
    assert statement.order == ("b", "a")
    assert statement.prepare_sql() == (
        "PREPARE probe_order (text, int) AS SELECT $1, $2, CAST($1 AS text) || '::x', 'a:b', x::int"
    )
    assert statement.execute_sql == "EXECUTE probe_order (%s, %s)"
    with pytest.raises(ValueError, match=r"no type for parameter\(s\) \['c'\]"):
        prepared.Statement("probe_types", "SELECT :c", {})
    with pytest.raises(ValueError, match="use"):
        prepared.Statement("Robert'); DROP", "SELECT 1", {})


@given(
    room=st.integers(min_value=1, max_value=5000), batch=st.integers(min_value=1, max_value=5000)
)
def test_claim_sizes_are_few_and_never_above_the_room(room: int, batch: int) -> None:
    wanted = min(room, batch)
    size = prepared.size_of(wanted, batch)
    assert 1 <= size <= wanted
    step = max(1, batch // prepared.EIGHTHS)
    if wanted >= step:  # an eighth of the batch at most is left unclaimed
        assert size % step == 0 or size == batch
        assert wanted - size < step
    else:  # below that, a power of two: more than half the room
        assert size & (size - 1) == 0 and size * 2 > wanted
    # Few distinct sizes for one batch size: few statements prepared per connection.
    assert (
        len({prepared.size_of(n, batch) for n in range(1, batch + 1)}) <= 20
    )  # below the cap of 32 per connection


def test_a_short_claim_is_under_an_eighth_of_the_batch_even_for_small_batches() -> None:
    assert prepared.is_short(24, 200) and not prepared.is_short(25, 200)
    # Batches under 8 (the rule was once ``claimed < batch // 8``, never true there):
    assert prepared.is_short(0, 4) and not prepared.is_short(1, 4)
    assert prepared.is_short(0, 1) and not prepared.is_short(1, 1)


def test_the_setting_reads_the_environment() -> None:
    assert Settings.from_env(env={}).prepared_statements is True
    assert Settings.from_env(env={"OUTBOX_PREPARED_STATEMENTS": "0"}).prepared_statements is False
    with pytest.raises(ConfigurationError, match="OUTBOX_PREPARED_STATEMENTS"):
        Settings.from_env(env={"OUTBOX_PREPARED_STATEMENTS": "maybe"})


@pytest.mark.parametrize("enabled", [True, False])
def test_the_worker_prepares_claims_only_after_a_short_one(
    engine: Engine, fast: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
    enabled: bool,
) -> None:  # fmt: skip
    """A backlog is claimed planned per call (full claims); once claims come back
    short, prepared; with OUTBOX_PREPARED_STATEMENTS=0, never. Every effect is
    delivered once either way."""
    calls: list[tuple[bool, int, int]] = []  # (prepared, limit, claimed)
    real_lease = store.lease

    def lease(*args: Any, prepared: bool = False) -> store.Claim:
        got = real_lease(*args, prepared=prepared)
        calls.append((prepared, args[2], len(got.effects)))
        return got

    monkeypatch.setattr(store, "lease", lease)
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
        for i in range(50):
            enqueue(conn, idempotency_key=effect_key("p", i), endpoint="hook", payload={"i": i})
    settings = dataclasses.replace(fast, claim_batch_size=8, prepared_statements=enabled)
    assert run_worker(settings, engine) == 0
    assert sorted(receiver.keys()) == sorted(effect_key("p", i) for i in range(50))
    for (_, _, before), (was_prepared, _, _) in itertools.pairwise(calls):
        assert was_prepared == (enabled and before < 1)  # of 8, a claim of 0 is short
    assert calls[0][0] == enabled  # nothing claimed before the first claim
    assert any(c[2] == 8 for c in calls) and any(not c[0] for c in calls)
