"""Wake-ups: producers NOTIFY one channel at commit; the worker LISTENs to it.

``notify(conn, reason)`` is how every producer (the Spark commit, ``enqueue``,
a requeue, a resumed endpoint) wakes dispatchers: NOTIFY is transactional, so
nothing is sent on rollback. The worker's ``Listener`` holds a dedicated
psycopg2 connection. A wake-up means "claim now"; the payload says whether it is
news (``wake(True)``: new work, anything an endpoint not yet in this worker's hands
may be waiting for) or only ``SUCCESSORS`` (``wake(False)``: a recorded effect's
ordering-key successor is due; a busy worker claims it with its next batch, not
at once). The socket is watched with ``loop.add_reader`` (no thread). When PostgreSQL goes away the
listener reconnects with backoff and wakes the worker once it is back, since
notifications sent meanwhile are lost; the worker's poll timer covers the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg2
import psycopg2.extensions
from sqlalchemy.engine import Connection

from spark_outbox.core.db import libpq_url, sqlalchemy_url
from spark_outbox.core.sqlfile import queries_beside

log = logging.getLogger(__name__)
_Q = queries_beside(__file__, "wakeup.sql")

# The one NOTIFY channel of the outbox.
CHANNEL = "outbox_effects"
# The payload of the trigger that wakes ordered keys' successors (objects/due.sql):
# every record of an ordered endpoint's outcomes sends it. Taken as news, each made
# a backlogged worker claim at any free room: 47 % more claims than an unordered
# drain, each reading an ordered claim's whole window (bench dispatch).
SUCCESSORS = "ordered"


def notify(conn: Connection, reason: str) -> None:
    """Wake dispatchers when ``conn``'s transaction commits."""
    conn.execute(_Q["notify"], {"channel": CHANNEL, "reason": reason})


class Listener:
    def __init__(self, url: str, wake: Callable[[bool], None]) -> None:
        self._dsn = libpq_url(sqlalchemy_url(url))
        self._wake = wake

    def _connect(self) -> psycopg2.extensions.connection:
        conn = psycopg2.connect(self._dsn, application_name="spark-outbox-listener")
        conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        with conn.cursor() as cur:
            cur.execute(f"LISTEN {CHANNEL}")
        return conn

    async def run(self) -> None:
        """Listen until cancelled; never returns on a database error, it reconnects."""
        loop = asyncio.get_running_loop()
        backoff = 0.1
        while True:
            try:
                conn = await asyncio.to_thread(self._connect)
            except psycopg2.Error as exc:
                log.warning(
                    "listener cannot connect", extra={"event": "listener.down", "error": str(exc)}
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            self._wake(True)  # anything notified while we were away
            lost: asyncio.Future[None] = loop.create_future()

            def readable(
                conn: psycopg2.extensions.connection = conn, lost: asyncio.Future[None] = lost
            ) -> None:
                try:
                    conn.poll()
                except psycopg2.Error as exc:
                    if not lost.done():
                        lost.set_exception(exc)
                    return
                if conn.notifies:
                    news = any(n.payload != SUCCESSORS for n in conn.notifies)
                    conn.notifies.clear()
                    self._wake(news)

            fd = conn.fileno()  # kept: a closed connection no longer tells it
            loop.add_reader(fd, readable)
            try:
                await lost
            except psycopg2.Error as exc:
                log.warning(
                    "listener connection lost", extra={"event": "listener.lost", "error": str(exc)}
                )
            finally:
                loop.remove_reader(fd)
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
