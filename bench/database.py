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
from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, wakeup
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings


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


def load(url: str, base: str, lat_base: str = "") -> Engine:
    """Endpoints ``bench`` (-> /hook), ``bench-limited`` (a rate limit and
    max_in_flight far above what one machine sends: the limits' bookkeeping, never
    their waiting), ``bench-ordered`` (per-key ordering) and ``lat`` (-> /lat of
    ``lat_base``, another receiver: another customer's server, default ``base``),
    pgqueuer's tables; an engine."""
    asyncio.run(_install_pgqueuer(url))
    engine = db.create_engine(url, pool_size=2)
    with engine.begin() as conn:
        add_webhook(conn, name="bench", url=f"{base}/hook")
        add_webhook(
            conn,
            name="bench-limited",
            url=f"{base}/hook",
            rate_limit_per_s=1_000_000.0,
            max_in_flight=100_000,
        )
        add_webhook(conn, name="bench-ordered", url=f"{base}/hook", ordered=True)
        add_webhook(conn, name="lat", url=f"{lat_base or base}/lat")
    return engine


def insert_effects(
    engine: Engine, n: int, endpoint: str = "bench", ordering_keys: int = 0, traced: bool = False
) -> None:
    """N effects for ``endpoint`` (the same body as every contender's) in one
    statement, committed with a wake-up; with ``ordering_keys``, effect g carries
    ordering key ``g % ordering_keys`` (round robin: each key's effects in order);
    ``traced``: each effect created in a trace (one per 1,000 effects, as a batch's)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " ordering_key, trace_parent)"
                " SELECT lpad(to_hex(g), 64, '0'), :endpoint, jsonb_build_object("
                "'type', 'invoice.created', 'n', g, 'currency', 'EUR', 'pad', :pad), 'x',"
                " CASE WHEN :keys > 0 THEN 'customer-' || (g % :keys) END,"
                " CASE WHEN :traced THEN '00-' || lpad(to_hex(g / 1000 + 1), 32, 'a') || '-'"
                " || lpad(to_hex(g / 1000 + 1), 16, 'b') || '-01' END"
                " FROM generate_series(1, :n) g"
            ),
            {"n": n, "pad": PAD, "endpoint": endpoint, "keys": ordering_keys, "traced": traced},
        )
        wakeup.notify(conn, "bench")
