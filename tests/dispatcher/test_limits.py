"""Limits that hold for all dispatchers together (endpoint_budgets), against real
PostgreSQL, the real CLI in three processes and one receiver that counts.

Tolerance of the rate limit, stated: it is a token bucket of rate ``r`` holding
one second of tokens (burst ``b = max(1, r)``), so the claims of any window of
``T`` seconds take at most ``r*T + b`` (any 1 s window: at most 2 r); at the
receiver, a send arrives some time after its claim (the first ones open their
connections; three workers, PostgreSQL and the receiver share two cores, with
other tests running), so a window may also see sends claimed up to 500 ms
before it: ``r/2`` more (without the shared budget, three workers send 3 r).
Checked for 1 s, 2 s and the whole run.
``max_in_flight`` holds exactly: a send is in flight only while its effect is
leased, and the claim counts leased effects under the budget row's lock.
"""

from __future__ import annotations

import bisect
import datetime as dt
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply

RATE_PER_S = 20.0
MAX_IN_FLIGHT = 3


def _most_in_any_window(times: list[float], window_s: float = 1.0) -> int:
    times = sorted(times)
    return max(bisect.bisect_left(times, t + window_s) - i for i, t in enumerate(times))


def test_three_dispatchers_keep_the_rate_limit_and_max_in_flight_together(
    engine: Engine, db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.script("/narrow", Reply(200, delay_s=0.2))
    with engine.begin() as conn:
        add_webhook(conn, name="rated", url=receiver.url("/rated"), rate_limit_per_s=RATE_PER_S)
        add_webhook(conn, name="narrow", url=receiver.url("/narrow"), max_in_flight=MAX_IN_FLIGHT)
    procs.enqueue_many(engine, 100, endpoint="rated")
    with engine.begin() as conn:  # 30 more keys, for the narrow endpoint
        conn.execute(
            sa.text(
                "UPDATE effects SET endpoint = 'narrow' WHERE id IN"
                " (SELECT id FROM effects ORDER BY id LIMIT 30)"
            )
        )
    env = procs.worker_env(db_url)
    workers = [
        procs.start(env, "--concurrency", "16", log=tmp_path / f"w{i}.log") for i in range(3)
    ]
    try:
        procs.wait_for(lambda: procs.states(engine) == {"delivered": 100}, 40, "every delivery")
    finally:
        codes = [procs.stop(w) for w in workers]
    assert codes == [0, 0, 0], [(tmp_path / f"w{i}.log").read_text() for i in range(3)]
    rated = [r.at for r in receiver.seen("/rated")]
    assert len(rated) == 70
    burst, jitter = max(1.0, RATE_PER_S), RATE_PER_S * 0.5
    span_s = max(rated) - min(rated) + 1e-3
    for window_s in (1.0, 2.0, span_s):
        most = _most_in_any_window(rated, window_s)
        assert most <= RATE_PER_S * window_s + burst + jitter, (window_s, most)
    assert receiver.most_in_flight["/narrow"] == MAX_IN_FLIGHT
    with engine.connect() as conn:
        in_flight = conn.execute(
            sa.text("SELECT in_flight FROM endpoint_budgets WHERE endpoint = 'narrow'")
        ).scalar_one()
    assert in_flight == 0  # every lease left the count


def _record(engine: Engine, claimed: list[store.Claimed], outcome: str) -> None:
    now = dt.datetime.now(dt.UTC)
    results = [
        store.Result(c.id, c.lease_token, c.attempt, outcome, now, 1.0, delay_s=0.0)
        for c in claimed
    ]
    store.record(engine, "w", results)


def test_a_failing_endpoint_rests_for_every_dispatcher_and_a_delivery_ends_the_rest(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "failing")
    insert_endpoint(engine, "fine")
    procs.enqueue_many(engine, 5, endpoint="failing")
    _record(engine, store.claim(engine, "w1", 10, 30), "retry")  # 5 failures in a row
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " VALUES (repeat('f', 64), 'fine', '{}', 'x')"
            )
        )
        resting, failures = conn.execute(
            sa.text(
                "SELECT resting_until > now(), failures FROM endpoint_budgets"
                " WHERE endpoint = 'failing'"
            )
        ).one()
    assert resting is True and failures == 5
    # Another dispatcher claims only the healthy endpoint's effect while it rests.
    assert [c.endpoint for c in store.claim(engine, "w2", 10, 30)] == ["fine"]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE endpoint_budgets SET resting_until = now()"))
    retried = store.claim(engine, "w2", 10, 30)
    assert {c.endpoint for c in retried} == {"failing"}
    _record(engine, retried[:1], "delivered")
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT failures, failing_since, resting_until FROM endpoint_budgets"
                " WHERE endpoint = 'failing'"
            )
        ).one()
    assert tuple(row) == (0, None, None)


def test_an_endpoint_out_of_tokens_does_not_hold_back_another_endpoints_effects(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "limited", rate_limit_per_s=1.0)
    insert_endpoint(engine, "free")
    with engine.begin() as conn:  # the limited endpoint's backlog is older than everything
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " next_attempt_at) SELECT lpad(to_hex(g), 64, '0'), 'limited', '{}', 'x',"
                " now() - interval '1 hour' FROM generate_series(1, 2000) g"
            )
        )
        conn.execute(sa.text("UPDATE endpoint_budgets SET tokens = 1, refilled_at = now()"))
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " VALUES (repeat('e', 64), 'free', '{}', 'x')"
            )
        )
    taken = [store.claim(engine, "w", 100, 30) for _ in range(3)]
    endpoints = sorted(c.endpoint for batch in taken for c in batch)
    # One token (refilled by a few ms at most) for the limited one, the free one's effect.
    assert endpoints == ["free", "limited"]


def test_max_in_flight_alone_fills_its_room_and_a_lowered_one_stops_claims_without_error(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "narrow", max_in_flight=5)
    insert_endpoint(engine, "free")
    procs.enqueue_many(engine, 20, endpoint="narrow")
    first = store.claim(engine, "w", 100, 30)
    assert len(first) == 5  # its whole room at once (no rate limit: no token bucket)
    with engine.begin() as conn:  # an operator lowers it below what is in flight
        conn.execute(sa.text("UPDATE endpoints SET max_in_flight = 2"))
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " VALUES (repeat('e', 64), 'free', '{}', 'x')"
            )
        )
    assert [c.endpoint for c in store.claim(engine, "w", 100, 30)] == ["free"]
    _record(engine, first, "delivered")
    assert len(store.claim(engine, "w", 100, 30)) == 2


def test_a_claim_skips_a_limited_endpoint_whose_budget_another_claim_holds(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "limited", max_in_flight=10)
    procs.enqueue_many(engine, 3, endpoint="limited")
    with engine.connect() as other:
        with other.begin():
            other.execute(
                sa.text("SELECT * FROM endpoint_budgets WHERE endpoint = 'limited' FOR UPDATE")
            )
            assert store.claim(engine, "w", 100, 30) == []  # no wait, no share
        assert len(store.claim(engine, "w", 100, 30)) == 3
