"""A fresh effect beside another endpoint's backlog (issue 31 item 2): it is
claimed in the next claim, and sent before most of the backlog, by a real worker
to a real receiver. Before: a claim took endpoints in a random order until its
limit (half the claims gave the backlog the whole batch), a backlogged worker
claimed only when half a batch of room was free, and claimed effects waited for
a sender in one queue behind up to a batch of the backlog's."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from spark_outbox.dispatch.worker import Worker
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, Reply

BACKLOG = 3000


def _backlog(engine: Engine, endpoint: str, n: int = BACKLOG) -> None:
    """``n`` effects of ``endpoint`` due for an hour (older than anything fresh)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " next_attempt_at) SELECT md5(:endpoint || g) || md5(g || :endpoint), :endpoint,"
                " '{}', 'x', now() - interval '1 hour' FROM generate_series(1, :n) g"
            ),
            {"endpoint": endpoint, "n": n},
        )


def _fresh(engine: Engine, key: str, endpoint: str = "fresh") -> float:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint=endpoint, payload={"key": key})
    return time.time()


def test_every_claim_beside_a_backlog_takes_the_fresh_effect_of_another_endpoint(
    engine: Engine,
) -> None:
    insert_endpoint(engine, "backlog")
    insert_endpoint(engine, "fresh")
    _backlog(engine, "backlog")
    for i in range(12):  # the old claim missed it in half of them (a random order)
        key = f"{0xF00 + i:064x}"
        _fresh(engine, key)
        claimed = store.claim(engine, "w", 100, 30)
        assert key in {c.idempotency_key for c in claimed}, i
        # the backlog takes its fair share (half) of the claim, not less
        assert sum(c.endpoint == "backlog" for c in claimed) == 50


def test_a_claim_shares_its_limit_round_robin_and_says_more_is_due(engine: Engine) -> None:
    for name in ("a", "b", "c"):
        insert_endpoint(engine, name)
    _backlog(engine, "a", 300)
    _backlog(engine, "b", 2)
    with engine.begin() as conn:  # an endpoint with nothing due has no share
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " next_attempt_at) VALUES (repeat('c', 64), 'c', '{}', 'x', now() + interval '1 h')"
            )
        )
    leased = store.lease(engine, "w", 100, 30)
    by_endpoint = [c.endpoint for c in leased.effects]
    assert sorted(set(by_endpoint)) == ["a", "b"]
    assert by_endpoint.count("b") == 2 and by_endpoint.count("a") == 50  # ceil(100 / 2)
    assert leased.full  # a filled its share: the worker claims again at once
    assert not store.lease(engine, "w", 1000, 30).full  # a's last 250: less than its share


def test_a_fresh_effect_is_sent_before_most_of_another_endpoints_backlog(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """A real worker (16 senders, batches of 500) drains 3,000 effects of one endpoint
    (each answered in 20 ms: at most 800 a second) when a fresh effect of another is
    committed: it arrives before 100 more of the backlog's, i.e. within a claim of
    ~125 ms however loaded the machine (before: 532, the next claim after half a
    batch of room, then behind up to 500 claimed ones in the senders' queue)."""
    receiver.script("/backlog", Reply(200, delay_s=0.02))
    with engine.begin() as conn:
        add_webhook(conn, name="backlog", url=receiver.url("/backlog"))
        add_webhook(conn, name="fresh", url=receiver.url("/fresh"))
    _backlog(engine, "backlog")
    settings = dataclasses.replace(fast, concurrency=16, claim_batch_size=500, lease_s=30.0)
    committed: list[float] = []

    async def produce() -> None:
        while len(receiver.seen("/backlog")) < 300:  # the worker is well into the backlog
            await asyncio.sleep(0.01)
        committed.append(await asyncio.to_thread(_fresh, engine, "f" * 64))

    async def main() -> int:
        worker = Worker(settings, engine, database_url=settings.database_url, until_idle=True)
        producer = asyncio.create_task(produce())
        try:
            return await asyncio.wait_for(worker.run(), 60)
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer  # its failure, if any, fails the test

    assert asyncio.run(main()) == 0
    (arrived,) = [r.at for r in receiver.seen("/fresh")]
    backlog_at = [r.at for r in receiver.seen("/backlog")]
    assert len(backlog_at) == BACKLOG  # the backlog was delivered too
    between = sum(committed[0] <= at < arrived for at in backlog_at)
    assert between < 100, (between, arrived - committed[0])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    due=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    limit=st.integers(1, 40),
)
def test_a_claim_gives_each_endpoint_its_fair_share_of_the_batch(
    engine: Engine, due: list[int], limit: int
) -> None:
    """The law, against real PostgreSQL: with n endpoints with something due, an
    endpoint gets at most ceil(limit / n) and at most what it has due; the claim
    takes all it may (the limit, or every share); an endpoint with something due
    gets at least one when the limit reaches n."""
    names = [f"e{i}" for i in range(len(due))]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM key_ledger"))
        conn.execute(sa.text("DELETE FROM effects"))
        conn.execute(sa.text("DELETE FROM endpoint_budgets"))
        conn.execute(sa.text("DELETE FROM endpoints"))
    for name, n in zip(names, due, strict=True):
        insert_endpoint(engine, name)
        _backlog(engine, name, n)
    taken = collections.Counter(c.endpoint for c in store.claim(engine, "w", limit, 30))
    n_due = sum(1 for n in due if n)
    fair = -(-limit // max(1, n_due))
    for name, n in zip(names, due, strict=True):
        assert taken[name] <= min(n, fair), (name, taken)
        if n and limit >= n_due:
            assert taken[name] >= 1, (name, taken)
    assert taken.total() == min(limit, sum(min(n, fair) for n in due)), taken
