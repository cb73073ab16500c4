"""A fresh bench database: the outbox schema, pgqueuer's schema, the bench endpoints."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import sqlalchemy as sa
from pgqueuer import AsyncpgDriver, Queries
from sqlalchemy.engine import Engine

from bench.payload import PAD
from dispatcher import db, wakeup
from dispatcher.endpoints import add_webhook
from dispatcher.settings import Settings
from outbox.database import database_url
from outbox.tools import scratch


@contextmanager
def bench_database() -> Iterator[str]:
    """A database migrated to the outbox head (dropped afterwards); its URL."""
    server = database_url(Settings.from_env())
    name = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    url = scratch.create_database(server, name)
    try:
        db.upgrade(url)
        yield url
    finally:
        scratch.drop_database(server, name)


def dsn(url: str) -> str:
    return db.libpq_url(db.sqlalchemy_url(url))


async def _install_pgqueuer(url: str) -> None:
    conn = await asyncpg.connect(dsn(url))
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


def load(url: str, base: str) -> Engine:
    """Endpoints ``bench`` (-> /hook) and ``lat`` (-> /lat), pgqueuer's tables; an engine."""
    asyncio.run(_install_pgqueuer(url))
    engine = db.create_engine(url, pool_size=2)
    with engine.begin() as conn:
        add_webhook(conn, name="bench", url=f"{base}/hook")
        add_webhook(conn, name="lat", url=f"{base}/lat")
    return engine


def insert_effects(engine: Engine, n: int) -> None:
    """N effects for endpoint ``bench`` (the same body as every contender's) in one
    statement, committed with a wake-up."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT lpad(to_hex(g), 64, '0'), 'bench', jsonb_build_object("
                "'type', 'invoice.created', 'n', g, 'currency', 'EUR', 'pad', :pad), 'x'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": n, "pad": PAD},
        )
        wakeup.notify(conn, "bench")
