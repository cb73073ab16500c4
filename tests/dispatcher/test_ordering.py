"""Per-key ordering (``endpoints.ordered``): a real worker sending 16 at a time,
real PostgreSQL, a receiver that records the arrival order per ordering key."""

from __future__ import annotations

import json
from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.endpoints import add_webhook
from dispatcher.enqueue import enqueue
from dispatcher.keys import effect_key
from dispatcher.settings import Settings
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
    from dispatcher import store

    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        add_webhook(conn, name="plain", url="http://127.0.0.1:9/p")
    _enqueue_interleaved(engine, "ordered")
    _enqueue_interleaved(engine, "plain", salt="plain")  # the same ordering keys, ignored here
    claimed = store.claim(engine, "w", 100, 30)
    heads = sorted(json.loads(c.payload)["n"] for c in claimed if c.endpoint == "ordered")
    assert heads == [0] * KEYS
    assert len([c for c in claimed if c.endpoint == "plain"]) == KEYS * PER_KEY
