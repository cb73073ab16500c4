"""Erasure end to end: one person's data filled into every table the outbox writes
(effects enqueued, attempts made by a real worker against a real loopback receiver
that echoes the person back, rejects, audit rows quoting them), erased, then the
whole database scanned: every text, JSON and bytea column of every table."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from spark_outbox.console import erasure, holds, operations, subjects
from spark_outbox.console.filters import build_filter
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import Receiver, Reply, run_worker

ANN = "ann.k7q@example.com"  # the person erased; the marker the scan looks for
BOB = "bob.z2w@example.com"  # another person, who must stay exactly as he was
LATER = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)
SCANNED_TYPES = ("text", "character varying", "json", "jsonb", "bytea", "ARRAY")


def _fill(engine: Engine, receiver: Receiver, who: str, name: str) -> dict[str, str]:
    """Every kind of row for one person; returns their keys by what became of them."""
    ok, bad = f"/{name}-ok", f"/{name}-bad"
    # The receiver echoes the person back: in an answer it first refuses, then takes,
    # and in a 400 (the attempts' excerpts and the effect's last error hold it).
    receiver.script(ok, Reply(500, body=f"busy, {who}"), Reply(200, body=f"got it {who}"))
    receiver.script(bad, Reply(400, body=f'{{"error": "no customer {who}"}}'))
    keys = {
        s: effect_key(f"erase.{name}", s)
        for s in ("delivered", "dead", "pending", "uncertain", "held", "cancelled")
    }
    payload = {"customer": {"email": who, "id": f"C-{name}"}, "amount": 12}
    with engine.begin() as conn:
        add_webhook(conn, name=f"{name}-ok", url=receiver.url(ok))
        add_webhook(conn, name=f"{name}-bad", url=receiver.url(bad))
        for state, key in keys.items():
            enqueue(
                conn,
                idempotency_key=key,
                endpoint=f"{name}-bad" if state == "dead" else f"{name}-ok",
                payload=payload,
                recipient=who,
                reference=f"INV-{who}",
                ordering_key=who,
                not_before=None if state in ("delivered", "dead") else LATER,
            )
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'uncertain', last_error = :error "
                "WHERE idempotency_key = :key"
            ),
            {"key": keys["uncertain"], "error": f"send to {who} started, outcome unknown"},
        )
        _hold(conn, keys["held"], name)
        _reject(conn, who, name)
        operations.cancel(
            conn, keys["cancelled"], actor="op", reason=f"customer {who} asked us to stop"
        )
        flt = build_filter(
            since=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
            until=dt.datetime(2020, 1, 2, tzinfo=dt.UTC),
            recipient=who,
        )
        operations.bulk_requeue(conn, flt, cap=10, dry_run=False, actor="op", reason="retry")
    return keys


def _hold(conn: Connection, key: str, name: str) -> None:
    """The effect as a batch the volume guard held leaves it: committed, parked."""
    run_id = uuid.uuid4()
    conn.execute(
        sa.text(
            "INSERT INTO batches (job, batch_id, run_id, hold_state, hold_reason) "
            "VALUES ('billing', :b, :r, 'held', '3 effects, 10x the usual')"
        ),
        {"b": f"held-{name}", "r": run_id},
    )
    conn.execute(
        sa.text(
            "UPDATE effects SET job = 'billing', batch_id = :b, run_id = :r, "
            "next_attempt_at = 'infinity' WHERE idempotency_key = :k"
        ),
        {"b": f"held-{name}", "r": run_id, "k": key},
    )


def _reject(conn: Connection, who: str, name: str) -> None:
    """Two rejects as the sink writes them: an effect row naming no endpoint, and one
    whose payload was not JSON (the reason quotes it)."""
    run_id = uuid.uuid4()
    rows = [
        (
            "endpoint: no endpoint named 'nowhere'",
            {"endpoint": "nowhere", "recipient": who, "payload": {"customer": {"email": who}}},
        ),
        (
            f'payload: not a JSON object: \'{{"email": "{who}", \'',
            {"endpoint": f"{name}-ok", "payload": f'{{"email": "{who}", '},
        ),
    ]
    for reason, raw in rows:
        conn.execute(
            sa.text(
                "INSERT INTO rejects (job, batch_id, run_id, reason, raw_row) "
                "VALUES ('billing', '7', :run_id, :reason, CAST(:raw AS jsonb))"
            ),
            {"run_id": run_id, "reason": reason, "raw": json.dumps(raw)},
        )


def _columns(conn: Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        sa.text(
            "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c "
            "JOIN information_schema.tables t USING (table_schema, table_name) "
            "WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' "
            "AND c.data_type = ANY(:types) ORDER BY 1, 2"
        ),
        {"types": list(SCANNED_TYPES)},
    )
    return [(r[0], r[1], r[2]) for r in rows]


def _holding(engine: Engine, marker: str) -> dict[str, int]:
    """Every table.column whose value holds the marker (any case), with its row count."""
    found: dict[str, int] = {}
    with engine.connect() as conn:
        for table, column, kind in _columns(conn):
            value = f"encode(\"{column}\", 'escape')" if kind == "bytea" else f'"{column}"::text'
            n = conn.execute(
                sa.text(f'SELECT count(*) FROM "{table}" WHERE strpos(lower({value}), :m) > 0'),
                {"m": marker.lower()},
            ).scalar_one()
            if n:
                found[f"{table}.{column}"] = n
    return found


def _rows_of(engine: Engine, marker: str, keys: list[str]) -> dict[str, list[str]]:
    """Each table's rows that are the person's (hold the marker, or are attempts or
    ledger rows of their effects), as PostgreSQL prints them: byte for byte."""
    with engine.connect() as conn:
        ids = (
            conn.execute(
                sa.text("SELECT id FROM effects WHERE idempotency_key = ANY(:k)"), {"k": keys}
            )
            .scalars()
            .all()
        )
        tables = sorted({t for t, _, _ in _columns(conn)})
        rows: dict[str, list[str]] = {}
        for table in tables:
            texts = conn.execute(sa.text(f'SELECT CAST(t AS text) FROM "{table}" t')).scalars()
            rows[table] = sorted(x for x in texts if marker in x or any(k in x for k in keys))
        attempts = conn.execute(
            sa.text("SELECT CAST(a AS text) FROM delivery_attempts a WHERE effect_id = ANY(:i)"),
            {"i": ids},
        ).scalars()
        rows["delivery_attempts"] = sorted(attempts)
    return rows


def _states(engine: Engine, keys: dict[str, str]) -> dict[str, str]:
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT idempotency_key, state FROM effects WHERE idempotency_key = ANY(:k)"),
            {"k": list(keys.values())},
        ).all()
    by_key = dict(found)
    return {what: by_key[key] for what, key in keys.items()}


def test_an_erased_person_is_nowhere_in_the_database_and_the_others_are_untouched(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    ann = _fill(engine, receiver, ANN, "ann")
    bob = _fill(engine, receiver, BOB, "bob")
    assert run_worker(fast, engine) == 0
    with engine.connect() as conn:
        (actor_row,) = conn.execute(
            sa.text("SELECT count(*) FROM delivery_attempts WHERE response_excerpt LIKE :m"),
            {"m": f"%{ANN}%"},
        ).one()
    assert actor_row >= 3  # the receiver's echoes are in the attempts
    # Before: Ann is in effects, attempts, rejects and the audit trail.
    held = _holding(engine, ANN)
    for column in (
        "effects.recipient",
        "effects.payload",
        "effects.reference",
        "effects.ordering_key",
        "effects.last_error",
        "delivery_attempts.response_excerpt",
        "rejects.raw_row",
        "rejects.reason",
        "operator_actions.reason",
        "operator_actions.target",
        "operator_actions.details",
    ):
        assert column in held, column
    bob_before = _rows_of(engine, BOB, list(bob.values()))
    before = _states(engine, ann)

    with engine.connect() as conn:
        plan = erasure.preview(conn, subjects.person(recipient=ANN))
    assert plan.dry_run and plan.effects == 6 and plan.cancelled == 3 and plan.rejects == 2
    assert plan.in_flight == 0 and plan.audit_rows == 2 and plan.attempts >= 3
    assert {x.idempotency_key: x.plan for x in plan.listed} == {
        ann["delivered"]: "erase",
        ann["dead"]: "erase",
        ann["pending"]: "cancel",
        ann["uncertain"]: "cancel",
        ann["held"]: "cancel",
        ann["cancelled"]: "erase",
    }
    assert _holding(engine, ANN) == held  # the dry run changed nothing

    progress: list[int] = []
    done = erasure.erase(
        engine,
        subjects.person(recipient=ANN),
        actor="dpo",
        reason=f"GDPR request of {ANN}, ticket 77",
        batch_size=2,  # three batches of effects: the loop carries on between them
        on_batch=progress.append,
    )
    assert progress == [2, 4, 6]  # each batch its own transaction, committed in turn
    assert (done.effects, done.cancelled, done.rejects, done.audit_rows) == (6, 3, 2, 2)
    assert done.complete and done.attempts == plan.attempts

    assert _holding(engine, ANN) == {}
    assert _holding(engine, "C-ann") == {}  # her other values went with the payloads
    assert _rows_of(engine, BOB, list(bob.values())) == bob_before
    # Kept: keys, states (unsent ones cancelled), and the ledger: never sent again.
    assert _states(engine, ann) == before | {
        "pending": "cancelled",
        "uncertain": "cancelled",
        "held": "cancelled",
    }
    with engine.begin() as conn:
        ledger = dict(
            conn.execute(
                sa.text(
                    "SELECT idempotency_key, state FROM key_ledger WHERE idempotency_key = ANY(:k)"
                ),
                {"k": list(ann.values())},
            ).all()
        )
        assert set(ledger) == set(ann.values())
        again = enqueue(conn, idempotency_key=ann["pending"], endpoint="ann-ok", payload={"x": 1})
        assert not again.new
        actions = conn.execute(
            sa.text(
                "SELECT action, target, reason, details FROM operator_actions "
                "WHERE action IN ('erase', 'erased') ORDER BY id"
            )
        ).all()
    assert [a.action for a in actions] == ["erase", "erased"]
    assert actions[0].reason == "GDPR request of [erased], ticket 77"
    assert actions[1].details["effects"] == 6
    seen = len(receiver.seen())
    with engine.begin() as conn:  # an operator releases the held batch after all
        holds.release(conn, "billing", "held-ann", actor="op", reason="ok", dry_run=False)
    assert run_worker(fast, engine) == 0
    assert len(receiver.seen()) == seen


def test_an_effect_being_sent_or_a_run_in_flight_is_left_for_a_later_erase_and_said_so(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/hook")
        for n in range(2):
            enqueue(
                conn,
                idempotency_key=effect_key("lease", n),
                endpoint="hook",
                payload={"n": n},
                recipient=ANN,
            )
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'leased', lease_token = gen_random_uuid(), "
                "lease_expires_at = now() + interval '1 minute' WHERE idempotency_key = :k"
            ),
            {"k": effect_key("lease", 0)},
        )
        # A Spark run in flight met an effect of Ann's another run had written.
        conn.execute(
            sa.text(
                "INSERT INTO deferred_effects (run_id, task_id, idempotency_key, endpoint, "
                "recipient, payload, payload_sha256) VALUES (gen_random_uuid(), 1, :k, "
                "'hook', :who, '{}', 'x')"
            ),
            {"k": effect_key("lease", 9), "who": ANN},
        )
    who = subjects.person(recipient=ANN)
    with engine.connect() as conn:
        plan = erasure.preview(conn, who)
    assert (plan.effects, plan.in_flight) == (1, 2)
    done = erasure.erase(engine, who, actor="dpo", reason="request 12")
    assert (done.effects, done.in_flight, done.complete) == (1, 2, False)
    with engine.connect() as conn:
        leased = conn.execute(
            sa.text(
                "SELECT state, recipient, lease_token IS NOT NULL FROM effects "
                "WHERE idempotency_key = :k"
            ),
            {"k": effect_key("lease", 0)},
        ).one()
    assert tuple(leased) == ("leased", ANN, True)  # its worker's lease still fences it
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE effects SET state = 'dead', lease_token = NULL"))
        conn.execute(sa.text("DELETE FROM deferred_effects"))  # the run committed
    assert erasure.erase(engine, who, actor="dpo", reason="request 12, again").complete
    assert _holding(engine, ANN) == {}


def test_erase_by_a_payload_field_erases_only_that_person(engine: Engine) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/hook")
        for who, cid in ((ANN, 42), (BOB, 1427)):
            enqueue(
                conn,
                idempotency_key=effect_key("cid", cid),
                endpoint="hook",
                payload={"customer": {"id": cid, "email": who}},
                not_before=LATER,
            )
    done = erasure.erase(
        engine,
        subjects.person(payload_field="customer.id=42"),
        actor="dpo",
        reason="customer 42 asked",
    )
    assert (done.effects, done.cancelled) == (1, 1)
    assert _holding(engine, ANN) == {} and _holding(engine, BOB) != {}
    with engine.connect() as conn:
        reason = conn.execute(
            sa.text("SELECT reason FROM operator_actions WHERE action = 'erase'")
        ).scalar_one()
    assert reason == "customer [erased] asked"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({}, "recipient"),
        ({"recipient": " "}, "recipient"),
        ({"recipient": ANN, "reference": "INV-1"}, "reference"),
        ({"payload_field": "customer.id"}, "payload_field"),
        ({"payload_field": "customer..id=4"}, "payload_field"),
    ],
)
def test_a_bad_selector_is_refused_naming_its_field(given: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        subjects.person(**given)
    assert caught.value.field == field


def test_an_unknown_payload_path_or_an_empty_reason_is_refused_and_changes_nothing(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/hook")
        enqueue(
            conn,
            idempotency_key=effect_key("p", 1),
            endpoint="hook",
            payload={"customer": {"id": "C1"}},
            recipient=ANN,
        )
    with pytest.raises(InvalidRequest) as caught:
        erasure.erase(
            engine, subjects.person(payload_field="customer.idd=C1"), actor="dpo", reason="asked"
        )
    assert caught.value.field == "payload_field" and "customer.idd" in str(caught.value)
    with pytest.raises(InvalidRequest) as caught:
        erasure.erase(engine, subjects.person(recipient=ANN), actor="dpo", reason="  ")
    assert caught.value.field == "reason"
    assert set(_holding(engine, ANN)) == {"effects.recipient"}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM operator_actions")).scalar() == 0


def test_the_audit_trail_still_refuses_a_rewrite_outside_an_erasure(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO operator_actions (actor, action, target, reason) "
                "VALUES ('op', 'erase', 'x', 'y')"
            )
        )
    for sql in (
        "UPDATE operator_actions SET reason = 'z'",
        "SELECT set_config('outbox.erasure', '1', true); UPDATE operator_actions SET actor = 'z'",
        "SELECT set_config('outbox.erasure', '1', true); DELETE FROM operator_actions",
    ):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text(sql))
