"""Whichever code path ends an ordered key's effects, the one behind them is woken.

An effect of an ordered endpoint waiting behind two earlier ones of its key is
parked out of the claim's range (store.park_blocked); a database trigger wakes it
when the effects before it stop blocking (objects/due.sql). Each path below is
the real code that ends effects, not a hand-written UPDATE: a path that ended
effects without waking the next (a trigger that misses its statement's kind)
would leave the third effect of the key parked for ever, and this test red."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.dispatch.store import Claimed

KEYS = ("k", "other")
PER_KEY = 3
SEND_BY_S = 1.5
PARKED = "state = 'pending' AND next_attempt_at = 'infinity'"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _setup(engine: Engine, expires_at: dt.datetime | None = None) -> None:
    """Three effects of each key on an ordered endpoint nobody answers; the third of
    each parked (it waits behind two). ``expires_at``: the send-by time of key k's
    first two."""
    from spark_outbox.dispatch import store

    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
    for n in range(PER_KEY):
        for key in KEYS:
            with engine.begin() as conn:
                enqueue(
                    conn,
                    idempotency_key=effect_key("wakes", key, n),
                    endpoint="ordered",
                    payload={"key": key, "n": n},
                    ordering_key=key,
                    expires_at=expires_at if key == "k" and n < 2 else None,
                )
    assert store.park_blocked(engine, crowded=1) == len(KEYS)


def _parked(engine: Engine) -> set[tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT ordering_key, payload FROM effects WHERE {PARKED}")
        ).all()
    return {(key, payload["n"]) for key, payload in rows}


def _heads_of_k(engine: Engine, worker: str, lease_s: float) -> list[Claimed]:
    """A claim; what it leased of key k (the rest stays leased, unrecorded)."""
    from spark_outbox.dispatch import store

    return [
        c for c in store.claim(engine, worker, 10, lease_s) if json.loads(c.payload)["key"] == "k"
    ]


def _record(outcome: str) -> Callable[[Engine], None]:
    """Claim key k's head and record ``outcome`` for it, twice (its first two)."""

    def end(engine: Engine) -> None:
        from spark_outbox.dispatch import store

        for _ in range(2):
            (head,) = _heads_of_k(engine, "w", 30)
            result = store.Result(head.id, head.lease_token, head.attempt, outcome, _now(), 1.0)
            assert store.record(engine, "w", [result]) == {(head.id, head.lease_token): True}

    return end


def _settle_uncertain(engine: Engine) -> None:
    """A send started, its lease ran out: the lease settles 'uncertain'."""
    from spark_outbox.dispatch import store

    for _ in range(2):
        (head,) = _heads_of_k(engine, "w", 0.2)
        assert store.start_sends(engine, [(head.id, head.lease_token)]) == {head.id}
        time.sleep(0.3)
        assert len(store.settle_uncertain(engine)) >= 1


def _expire(engine: Engine) -> None:
    """The expiry pass: both earlier effects of key k end 'expired' in one statement."""
    from spark_outbox.dispatch import store

    time.sleep(SEND_BY_S)  # past the send-by time of key k's first two
    assert len(store.expire_due(engine)) == 2


def _cancel(engine: Engine) -> None:
    """An operator cancels the two pending effects before the third."""
    from spark_outbox.console import operations

    for n in range(2):
        with engine.begin() as conn:
            operations.cancel(conn, effect_key("wakes", "k", n), actor="test", reason="not wanted")


def _delete(engine: Engine) -> None:
    """Deleted unfinished (the sweeper deletes a run's rows that can never commit)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM effects WHERE ordering_key = 'k' AND payload->>'n' IN ('0', '1')")
        )


PATHS: dict[str, Callable[[Engine], None]] = {
    "recorded delivered": _record("delivered"),
    "recorded dead": _record("dead"),
    "recorded uncertain": _record("uncertain"),
    "recorded expired before its first byte": _record("expired"),
    "a started send's lease run out": _settle_uncertain,
    "the expiry pass": _expire,
    "an operator's cancel": _cancel,
    "deleted": _delete,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_whichever_path_ends_the_effects_before_a_parked_one_wakes_it(
    engine: Engine, path: str
) -> None:
    expiring = path == "the expiry pass"
    _setup(engine, expires_at=_now() + dt.timedelta(seconds=SEND_BY_S) if expiring else None)
    assert _parked(engine) == {("k", 2), ("other", 2)}
    PATHS[path](engine)
    # Key k's third effect is due again, and the next claim takes it; the other
    # key's stays parked: nothing is woken that still waits.
    assert _parked(engine) == {("other", 2)}
    claimed = _heads_of_k(engine, "w2", 30)
    assert [c.idempotency_key for c in claimed] == [effect_key("wakes", "k", 2)]


def test_waking_a_record_s_successors_reads_no_other_parked_effect_on_stale_statistics(
    engine: Engine,
) -> None:
    """Statistics taken before anything was parked say 'infinity' is rare: the wake
    must still find its successors by id, not walk every parked effect of the table
    (ix_effects_due) against each of them (~130 ms a record of 300 in the bench)."""
    keys, per_key = 300, 60
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key) SELECT lpad(to_hex(g), 64, '0'), 'ordered',"
                " jsonb_build_object('n', g), 'x', 'customer-' || (g % :keys)"
                " FROM generate_series(0, :n - 1) g"
            ),
            {"keys": keys, "n": keys * per_key},
        )
        conn.execute(sa.text("ANALYZE effects"))  # nothing parked yet
        # Every effect behind a head parked, each head leased (as the claim leaves it).
        conn.execute(
            sa.text("UPDATE effects SET next_attempt_at = 'infinity' WHERE id > :heads"),
            {"heads": keys},
        )
        conn.execute(
            sa.text("UPDATE effects SET state = 'leased' WHERE id <= :heads"), {"heads": keys}
        )
    with engine.begin() as conn:
        due_before = _index_reads(conn, "ix_effects_due")
        finished = conn.execute(
            sa.text("UPDATE effects SET state = 'delivered' WHERE state = 'leased'")
        ).rowcount
        read = _index_reads(conn, "ix_effects_due") - due_before
    assert finished == keys
    assert len(_parked(engine)) == keys * (per_key - 2)  # each head's next woken
    assert read < keys, f"the wake read {read} entries of ix_effects_due"


def _index_reads(conn: sa.Connection, index: str) -> int:
    """Entries of ``index`` this transaction has read so far."""
    return int(
        conn.execute(
            sa.text("SELECT pg_stat_get_xact_tuples_returned(CAST(:i AS regclass))"), {"i": index}
        ).scalar_one()
    )


def test_a_parking_pass_parks_only_keys_that_crowd_the_claim_s_front(engine: Engine) -> None:
    """Parking costs two rewrites of each parked effect (parked, woken); a key with a
    few rows in the front a claim walks costs that claim a few rows. So only a key
    holding store.PARK_CROWDED or more of the front's rows is parked."""
    from spark_outbox.dispatch import store

    shallow, deep = store.PARK_CROWDED - 1, 3 * store.PARK_CROWDED
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key) SELECT lpad(to_hex(g), 64, '0'), 'ordered',"
                " jsonb_build_object('n', g), 'x', CASE WHEN g < :deep THEN 'deep'"
                " ELSE 'shallow-' || (g % 20) END"
                " FROM generate_series(0, :deep + 20 * :shallow - 1) g"
            ),
            {"deep": deep, "shallow": shallow},
        )
    assert store.park_blocked(engine) == deep - 2
    assert {key for key, _ in _parked(engine)} == {"deep"}
