"""The worker's listener, on a real PostgreSQL: what a notification means."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from spark_outbox.core import wakeup
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key

Step = Callable[[Connection], None]


def _heard(db_url: str, engine: Engine, *steps: Step) -> list[bool]:
    """What a listener told its worker (``news``): once on connecting, then once
    for each step, each run and committed in its own transaction."""

    async def listen() -> list[bool]:
        calls: list[bool] = []
        heard = asyncio.Event()

        def wake(news: bool) -> None:
            calls.append(news)
            heard.set()

        listener = asyncio.create_task(wakeup.Listener(db_url, wake).run())
        try:
            await asyncio.wait_for(heard.wait(), 10)  # connected (and listening)
            for step in steps:
                heard.clear()
                with engine.begin() as conn:
                    step(conn)
                await asyncio.wait_for(heard.wait(), 10)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        return calls

    return asyncio.run(listen())


def _notify(*reasons: str) -> Step:
    def step(conn: Connection) -> None:
        for reason in reasons:
            wakeup.notify(conn, reason)

    return step


def test_an_ordered_key_s_successor_wakes_a_worker_without_being_news(
    db_url: str, engine: Engine
) -> None:
    """Every record of an ordered endpoint's outcomes notifies its successors; taken
    as news, it made a backlogged worker claim at any free room (many small claims,
    each reading an ordered claim's whole window). New work is news, also when it
    shares a commit with a successor's notification."""
    steps = _notify(wakeup.SUCCESSORS), _notify("commit"), _notify(wakeup.SUCCESSORS, "enqueue")
    assert _heard(db_url, engine, *steps) == [True, False, True, True]


def test_the_unpark_trigger_notifies_what_the_listener_takes_for_a_successor(
    db_url: str, engine: Engine
) -> None:
    """The payload the listener tells apart is the one the trigger sends
    (objects/due.sql): a key's head finishing wakes a worker with news=False."""
    with engine.begin() as conn:
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        for n in range(2):
            enqueue(
                conn,
                idempotency_key=effect_key("wakeup", n),
                endpoint="ordered",
                payload={"n": n},
                ordering_key="customer",
            )

    def finish_head(conn: Connection) -> None:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'cancelled'"
                " WHERE id = (SELECT min(id) FROM effects WHERE endpoint = 'ordered')"
            )
        )

    assert _heard(db_url, engine, finish_head) == [True, False]
