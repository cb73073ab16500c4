"""Per-key ordering (``endpoints.ordered``): a real worker sending 16 at a time,
real PostgreSQL, a receiver that records the arrival order per ordering key."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
from collections import defaultdict

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import Receiver, Reply, run_worker

KEYS = 4
PER_KEY = 6


def _enqueue_interleaved(engine: Engine, endpoint: str, salt: str = "ordered") -> None:
    """PER_KEY effects for each of KEYS ordering keys, one transaction each, interleaved."""
    for n in range(PER_KEY):
        for k in range(KEYS):
            with engine.begin() as conn:
                enqueue(
                    conn,
                    idempotency_key=effect_key(salt, k, n),
                    endpoint=endpoint,
                    payload={"key": f"customer-{k}", "n": n},
                    ordering_key=f"customer-{k}",
                )


def _ordered_and_plain(engine: Engine, plain: bool = True) -> None:
    """An ordered endpoint ``ordered`` (and, with ``plain``, an unordered ``plain``)
    on an address nobody answers, each with KEYS x PER_KEY effects, interleaved (the
    same ordering keys on both)."""
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        if plain:
            add_webhook(conn, name="plain", url="http://127.0.0.1:9/p")
    _enqueue_interleaved(engine, "ordered")
    if plain:
        _enqueue_interleaved(engine, "plain", salt="plain")


def _arrivals(receiver: Receiver, path: str) -> dict[str, list[int]]:
    """The payload numbers per ordering key, in the order of their last arrival (the
    one that was answered 2xx: every request after a success is a 200 here)."""
    seen: dict[str, list[int]] = defaultdict(list)
    for request in receiver.seen(path):
        body = json.loads(request.body)
        numbers = seen[body["key"]]
        if body["n"] in numbers:
            numbers.remove(body["n"])
        numbers.append(body["n"])
    return dict(seen)


def test_an_ordered_endpoint_gets_each_key_strictly_in_order_even_across_a_retry(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    # The first request fails (a 503: retried 0.2 s later); every other one succeeds.
    receiver.script("/ordered", Reply(503), Reply(200))
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url=receiver.url("/ordered"), ordered=True)
    _enqueue_interleaved(engine, "ordered")
    assert run_worker(fast, engine) == 0
    in_order = list(range(PER_KEY))
    assert _arrivals(receiver, "/ordered") == {f"customer-{k}": in_order for k in range(KEYS)}
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT state, count(*) FROM effects GROUP BY 1")).all())
        retried = conn.execute(
            sa.text("SELECT payload FROM effects WHERE attempt_count = 2")
        ).scalar_one()
    assert states == {"delivered": KEYS * PER_KEY}
    assert retried["n"] == 0  # a head was retried, and its key's others waited for it


def test_a_dead_earlier_effect_unblocks_the_next_and_other_keys_never_wait(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/ordered", Reply(400), Reply(200))  # the first one is refused: dead
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url=receiver.url("/ordered"), ordered=True)
    _enqueue_interleaved(engine, "ordered")
    assert run_worker(fast, engine) == 0
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT state, count(*) FROM effects GROUP BY 1")).all())
    assert states == {"dead": 1, "delivered": KEYS * PER_KEY - 1}
    arrivals = _arrivals(receiver, "/ordered")
    assert all(ns == sorted(ns) and len(ns) == PER_KEY for ns in arrivals.values())


def test_the_claim_takes_only_the_head_of_each_key_and_unordered_endpoints_take_all(
    engine: Engine,
) -> None:
    from spark_outbox.dispatch import store

    _ordered_and_plain(engine)
    claimed = store.claim(engine, "w", 100, 30)
    heads = sorted(json.loads(c.payload)["n"] for c in claimed if c.endpoint == "ordered")
    assert heads == [0] * KEYS
    assert len([c for c in claimed if c.endpoint == "plain"]) == KEYS * PER_KEY


# --- Parking (migration 1104, store.park_blocked) ---------------------------------

PARKED = "next_attempt_at = 'infinity'"


def _parked(engine: Engine, endpoint: str) -> dict[str, list[int]]:
    """The payload numbers of the parked effects, per ordering key."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT ordering_key, payload FROM effects WHERE endpoint = :e AND {PARKED}"
                " ORDER BY ordering_key, id"
            ),
            {"e": endpoint},
        ).all()
    parked: dict[str, list[int]] = defaultdict(list)
    for key, payload in rows:
        parked[key].append(payload["n"])
    return dict(parked)


def _finish(engine: Engine, endpoint: str, key: str, n: int, how: str) -> None:
    """Effect ``n`` of ``key`` stops blocking its successors, as ``how`` makes it."""
    where = "endpoint = :e AND ordering_key = :k AND CAST(payload->>'n' AS int) = :n"
    sql = {
        "delivered": f"UPDATE effects SET state = 'delivered' WHERE {where}",
        "dead": f"UPDATE effects SET state = 'dead' WHERE {where}",
        "cancelled": f"UPDATE effects SET state = 'cancelled' WHERE {where}",
        "uncertain": f"UPDATE effects SET state = 'uncertain' WHERE {where}",
        "deleted": f"DELETE FROM effects WHERE {where}",
    }[how]
    with engine.begin() as conn:
        assert conn.execute(sa.text(sql), {"e": endpoint, "k": key, "n": n}).rowcount == 1


def _claim_walk_plan(engine: Engine, options: str) -> str:
    """EXPLAIN (options) of the claim's walk of the ordered endpoint's due effects."""
    with engine.connect() as conn:
        return "\n".join(
            conn.execute(
                sa.text(
                    f"EXPLAIN ({options}) SELECT e.id FROM due_effects e"
                    " WHERE e.endpoint = 'ordered' ORDER BY e.next_attempt_at LIMIT 100"
                )
            ).scalars()
        )


def test_effects_waiting_behind_two_of_their_key_are_parked_and_the_claim_walks_the_next(
    engine: Engine,
) -> None:
    """Each key's head and the one right behind it stay due (the next is claimable the
    moment the head finishes: parking and waking it would cost two rewrites of the
    wide row); every later one is parked, out of the claim's walk."""
    from spark_outbox.dispatch import store

    _ordered_and_plain(engine)
    # Every effect but each key's first two; none of the unordered endpoint's.
    assert store.park_blocked(engine, crowded=1) == KEYS * (PER_KEY - 2)
    behind = list(range(2, PER_KEY))
    assert _parked(engine, "ordered") == {f"customer-{k}": behind for k in range(KEYS)}
    assert _parked(engine, "plain") == {}
    assert store.park_blocked(engine, crowded=1) == 0  # nothing left to park
    # The claim's walk of ix_effects_due: the heads and their next, the parked rows not
    # at all (the next of each key is walked, and left: its head is unfinished).
    plan = _claim_walk_plan(engine, "ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF")
    assert f"rows={KEYS} loops=1" in plan.splitlines()[0], plan
    walk = re.split(r"\n\s*SubPlan \d+\n", plan.split("ix_effects_due", 1)[1])[0]
    assert f"Rows Removed by Filter: {KEYS}\n" in walk + "\n", plan  # the scan's own lines
    claimed = store.claim(engine, "w", 100, 30)
    assert [json.loads(c.payload)["n"] for c in claimed if c.endpoint == "ordered"] == [0] * KEYS


@pytest.mark.parametrize("how", ["delivered", "dead", "cancelled", "uncertain", "deleted"])
def test_an_effect_that_stops_blocking_wakes_its_successor_whatever_path_ends_it(
    engine: Engine, how: str
) -> None:
    from spark_outbox.dispatch import store

    _ordered_and_plain(engine, plain=False)
    store.park_blocked(engine, crowded=1)
    _finish(engine, "ordered", "customer-1", 0, how)  # its next (1) was never parked
    assert _parked(engine, "ordered")["customer-1"] == list(range(2, PER_KEY))
    _finish(engine, "ordered", "customer-1", 1, how)
    # Only the next one of that key is due again; the rest of the key, and every
    # other key's parked ones, stay parked.
    parked = _parked(engine, "ordered")
    assert parked["customer-1"] == list(range(3, PER_KEY))
    assert all(parked[f"customer-{k}"] == list(range(2, PER_KEY)) for k in (0, 2, 3))
    claimed = {
        json.loads(c.payload)["n"]
        for c in store.claim(engine, "w", 100, 30)
        if json.loads(c.payload)["key"] == "customer-1"
    }
    assert claimed == {2}


def test_an_endpoint_no_longer_ordered_gets_its_parked_effects_due_at_once(
    engine: Engine,
) -> None:
    from spark_outbox.console import admin
    from spark_outbox.dispatch import store

    _ordered_and_plain(engine, plain=False)
    assert store.park_blocked(engine, crowded=1) == KEYS * (PER_KEY - 2)
    with engine.begin() as conn:
        admin.update_endpoint(
            conn, "ordered", {"ordered": False}, actor="test", reason="order no longer needed"
        )
    assert _parked(engine, "ordered") == {}
    assert len(store.claim(engine, "w", 100, 30)) == KEYS * PER_KEY


def test_parking_beside_finishing_effects_never_strands_one(engine: Engine) -> None:
    """Parking passes run in a loop while another connection claims each key's head and
    finishes it: every effect is finished in its key's order, and none is left parked
    with nothing earlier unfinished (the FOR SHARE on the earlier effect: without it a
    head that finishes between the pass's snapshot and its commit strands the next)."""
    from spark_outbox.dispatch import store

    keys, per_key = 8, 25
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key) SELECT lpad(to_hex(g), 64, '0'), 'ordered',"
                " jsonb_build_object('key', 'k' || (g % :keys), 'n', g / :keys), 'x',"
                " 'k' || (g % :keys) FROM generate_series(0, :total - 1) g"
            ),
            {"keys": keys, "total": keys * per_key},
        )
    stop = threading.Event()
    passes = [0]

    def park() -> None:
        while not stop.is_set():
            store.park_blocked(engine, crowded=1)
            passes[0] += 1

    parker = threading.Thread(target=park)
    parker.start()
    order: dict[str, list[int]] = defaultdict(list)
    deadline = time.monotonic() + 20
    try:
        while sum(map(len, order.values())) < keys * per_key:
            assert time.monotonic() < deadline, f"stranded: {_parked(engine, 'ordered')}"
            claimed = store.claim(engine, "w", 4, 30)
            for c in claimed:
                payload = json.loads(c.payload)
                order[payload["key"]].append(payload["n"])
            with engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE effects SET state = 'delivered' WHERE id = ANY(:ids)"),
                    {"ids": [c.id for c in claimed]},
                )
    finally:
        stop.set()
        parker.join()
    assert passes[0] > 10
    assert order == {f"k{k}": list(range(per_key)) for k in range(keys)}


def _burst_after_stale_statistics(engine: Engine, keys: int) -> None:
    """30,000 ordered effects delivered, ANALYZE (the statistics now say nothing
    is due), then a burst of 30,000 more over ``keys`` keys: a bench's next round."""
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
    insert = sa.text(
        "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, ordering_key,"
        " state) SELECT lpad(to_hex(g + :base), 64, '0'), 'ordered', '{}', 'x',"
        " 'k' || (g % :keys), :state FROM generate_series(1, 30000) g"
    )
    with engine.begin() as conn:  # written delivered: an UPDATE of them all in the same
        # transaction walked every version of each key (minutes, for nothing tested here)
        conn.execute(insert, {"base": 0, "keys": keys, "state": "delivered"})
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE effects"))
        conn.execute(insert, {"base": 100_000, "keys": keys, "state": "pending"})


def test_a_parking_pass_probes_its_window_only_when_statistics_say_the_queue_is_empty(
    engine: Engine,
) -> None:
    """The same stale statistics once made a parking pass probe (and lock FOR SHARE)
    every due row before its window's LIMIT and find the front's rows by rescanning
    all due rows: 5-7 s a pass in the bench, 146 s here, the recorder waiting on its
    locks. Now: one probe per window row, each in ix_effects_ordering; each blocked
    row locked by its primary key."""
    from spark_outbox.dispatch import store

    _burst_after_stale_statistics(engine, keys=100)
    with engine.connect() as conn, conn.begin() as tx:
        conn.exec_driver_sql("SET LOCAL statement_timeout = '20s'")
        for name, value in store.ENGINE_OPTIONS["session_settings"].items():
            conn.exec_driver_sql(f"SET LOCAL {name} = {value}")  # as a dispatcher plans it
        sql = store._Q["park_blocked"].text.replace(":window", str(store.PARK_WINDOW))
        sql = sql.replace(":crowded", "1")
        plan = "\n".join(
            conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}").scalars()
        )
        tx.rollback()
    # The probes: one step back in ix_effects_ordering per window row, then one more.
    window = store.PARK_WINDOW
    step = r"Scan Backward using ix_effects_ordering on effects {} \(actual rows=1 loops={}\)"
    assert re.search(step.format("p", window), plan), plan
    assert re.search(step.format("r", r"\d+"), plan), plan
    assert "Index Scan using pk_effects on effects e_2 (actual rows=1 loops=800)" in plan, plan
    # The real pass parks the window's 800 effects behind two of their key (100 keys'
    # heads and their next stay due).
    assert store.park_blocked(engine, crowded=1) == 800


def test_the_ordering_probe_stays_on_its_index_when_statistics_say_the_queue_is_empty(
    engine: Engine, db_url: str
) -> None:
    """Statistics taken while everything was delivered, then a burst: the probe for
    an earlier unfinished effect must still be one step in ix_effects_ordering, not
    a walk of the endpoint's range of ix_effects_due (8.2 s for one claim behind
    29,000 waiting effects before migration 1104)."""
    from spark_outbox.core import db
    from spark_outbox.dispatch import store

    _burst_after_stale_statistics(engine, keys=1000)
    dispatcher_engine = db.create_engine(db_url, **store.ENGINE_OPTIONS)
    try:
        plan = _claim_walk_plan(dispatcher_engine, "COSTS OFF")
    finally:
        dispatcher_engine.dispose()
    assert "ix_effects_ordering on effects p" in plan, plan  # the probe's table alias
    assert "ix_effects_due on effects p" not in plan, plan


def test_a_finished_effect_wakes_the_dispatchers_for_the_next_of_its_key(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """A long-running worker polling every 5 s: each effect of one key goes out as
    soon as the one before it is recorded (the trigger's NOTIFY), not at the next
    poll (5 effects: 15 s without the notification, checked)."""
    from spark_outbox.dispatch.worker import Worker

    settings = dataclasses.replace(fast, poll_interval_s=5.0)
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url=receiver.url("/ordered"), ordered=True)
    for n in range(5):
        with engine.begin() as conn:
            enqueue(
                conn,
                idempotency_key=effect_key("wake", n),
                endpoint="ordered",
                payload={"key": "customer-0", "n": n},
                ordering_key="customer-0",
            )
    delivered = sa.text("SELECT count(*) FROM effects WHERE state = 'delivered'")

    async def main() -> float:
        worker = Worker(settings, engine, database_url=settings.database_url)
        running = asyncio.create_task(worker.run())
        started = time.monotonic()
        try:
            while time.monotonic() - started < 30:
                with engine.connect() as conn:
                    if conn.execute(delivered).scalar_one() == 5:
                        return time.monotonic() - started
                await asyncio.sleep(0.05)
            raise AssertionError("not delivered within 30 s")
        finally:
            worker.stop()
            assert await running == 0

    assert asyncio.run(main()) < 4.0
    assert _arrivals(receiver, "/ordered") == {"customer-0": [0, 1, 2, 3, 4]}


def test_nothing_is_parked_on_a_schema_without_the_waking_trigger(engine: Engine) -> None:
    """A dispatcher newer than the database's migrations parks nothing: with no
    trigger to wake them, parked effects would wait for ever."""
    from spark_outbox.dispatch import store

    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        conn.execute(sa.text("DROP TRIGGER effects_unpark_on_finish ON effects"))
    _enqueue_interleaved(engine, "ordered")
    assert store.park_blocked(engine, crowded=1) == 0
    assert _parked(engine, "ordered") == {}


def test_a_claim_behind_a_deep_key_probes_its_window_of_the_endpoint_only(
    engine: Engine,
) -> None:
    """Three windows' worth of one key's effects wait behind its leased head, not
    parked yet: a claim looks at ``store.CLAIM_WINDOW`` of them at most (it probed
    every one: ~150 ms a claim behind 100,000) and probes one, the key's earliest
    there, and the other endpoint still gets its share."""
    from spark_outbox.dispatch import store

    deep = 3 * store.CLAIM_WINDOW
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        add_webhook(conn, name="plain", url="http://127.0.0.1:9/p")
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key) SELECT lpad(to_hex(g), 64, '0'), 'ordered', '{}', 'x', 'k'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": deep},
        )
    (head,) = store.claim(engine, "w", 1, 60)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT 'p' || lpad(to_hex(g), 63, '0'), 'plain', '{}', 'x'"
                " FROM generate_series(1, 10) g"
            )
        )
    with engine.connect() as conn, conn.begin() as tx:
        for name, value in store.ENGINE_OPTIONS["session_settings"].items():
            conn.exec_driver_sql(f"SET LOCAL {name} = {value}")  # as a dispatcher plans it
        sql = store._Q["claim"].text
        params = {"worker_id": "w", "limit": 100, "lease_s": 60, "window": store.CLAIM_WINDOW}
        params = {name: v for name, v in params.items() if f":{name}" in sql}
        explain = sa.text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql)
        plan = "\n".join(conn.execute(explain, params).scalars())
        tx.rollback()
    probes = [
        int(m.group(1))
        for m in re.finditer(r"Scan Backward using ix_effects_ordering .*loops=(\d+)\)", plan)
    ]
    # Of the window's effects of one key only the earliest is probed (all 1,000 were:
    # ~8 ms a claim behind 100,000, bench/RESULTS.md).
    assert probes and max(probes) == 1, plan
    claimed = store.claim(engine, "w", 100, 60)
    assert sorted(c.endpoint for c in claimed) == ["plain"] * 10
    assert head.endpoint == "ordered"


def test_a_parking_pass_behind_a_deep_key_probes_each_waiting_effect_once(
    engine: Engine,
) -> None:
    """The whole front is probed before anything is parked: probed while its UPDATE
    ran, each probe stepped back over every effect of its key this pass had just
    parked (SKIP LOCKED skips what the statement itself changed), O(window^2) a
    pass behind a deep key (1.3-2.1 s a pass behind 20,000 effects of one key)."""
    from spark_outbox.dispatch import store

    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key) SELECT lpad(to_hex(g), 64, '0'), 'ordered', '{}', 'x', 'k'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": 5 * store.PARK_WINDOW},
        )
        conn.execute(sa.text("ANALYZE effects"))
    store.claim(engine, "w", 1, 60)  # the head, leased
    with engine.connect() as conn, conn.begin() as tx:
        for name, value in store.ENGINE_OPTIONS["session_settings"].items():
            conn.exec_driver_sql(f"SET LOCAL {name} = {value}")  # as a dispatcher plans it
        sql = store._Q["park_blocked"].text.replace(":window", str(store.PARK_WINDOW))
        sql = sql.replace(":crowded", "1")
        plan = "\n".join(
            conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}").scalars()
        )
        tx.rollback()
    # (the key is the endpoint's only one: ix_effects_ordering or the endpoint's
    # index by created_at serve the probe alike)
    probe = re.search(r"Index Scan Backward using ix_effects_\w+ on effects p (.*)", plan)
    assert probe is not None, plan
    assert probe.group(1) == f"(actual rows=1 loops={store.PARK_WINDOW})", plan
    # The window but the head's next (its head is being sent: it stays due).
    assert store.park_blocked(engine, crowded=1) == store.PARK_WINDOW - 1


def test_the_claim_locks_an_ordered_endpoint_s_front_by_row_address_on_stale_statistics(
    engine: Engine,
) -> None:
    """Statistics taken while nothing was due, then 30,000 waiting effects nobody has
    parked yet: the claim's lock of each front row by its id was planned as a range
    scan of ix_effects_due filtered by the id (the due condition of due_effects is
    that index's range), every due row read per front row: an 8.2-s claim in the
    bench (500 loops, 28,059 rows removed by the filter each; 3 s here). Each row is
    found by the address the claim's window read (a TID scan), whatever the
    statistics say (migration 2811)."""
    from spark_outbox.dispatch import store

    _burst_after_stale_statistics(engine, keys=1000)
    with engine.connect() as conn, conn.begin() as tx:
        conn.exec_driver_sql("SET LOCAL statement_timeout = '20s'")
        for name, value in store.ENGINE_OPTIONS["session_settings"].items():
            conn.exec_driver_sql(f"SET LOCAL {name} = {value}")  # as a dispatcher plans it
        sql = store._Q["claim"].text
        params = {"worker_id": "w", "limit": 500, "lease_s": 60, "window": store.CLAIM_WINDOW}
        params = {name: v for name, v in params.items() if f":{name}" in sql}
        explain = sa.text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql)
        plan = "\n".join(conn.execute(explain, params).scalars())
        tx.rollback()
    # The front: one row of each of the window's keys, each found by its address.
    locks = re.search(r"Tid Scan on effects e_\d+ \(actual rows=1 loops=(\d+)\)", plan)
    assert locks and int(locks.group(1)) >= 500, plan
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert max(removed, default=0) < 1000, plan
    assert len(store.claim(engine, "w", 500, 60)) == 500
