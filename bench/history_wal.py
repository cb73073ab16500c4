"""What a drain writes, per delivery: WAL bytes, full-page images and the buffers
backends had to write themselves, read from the cluster's counters around it.

A fresh effect's key lands on a random leaf of two big key indexes (the effects'
unique key, the ledger's primary key). The first change of a leaf after a
checkpoint logs the whole 8 kB page (a full-page image), and a dirty leaf evicted
from shared_buffers is written by the backend that needs the buffer (after
flushing the WAL up to it). Beside an empty outbox the same keys share a few
hundred hot leaves. These counters say which of the two a drain paid for.

The counters are the cluster's (``pg_stat_wal``, ``pg_stat_bgwriter``): the two
sides share the bench's cluster and run one after the other, so a side's drain
is the only writer while it runs (autovacuum and the checkpointer aside).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench import history_cluster
from spark_outbox.core import db

_COUNTERS = sa.text("""
SELECT w.wal_bytes::float8 AS wal_bytes, w.wal_fpi::float8 AS wal_fpi,
       b.buffers_backend::float8 AS backend_writes,
       b.checkpoints_timed + b.checkpoints_req AS checkpoints
FROM pg_stat_wal w, pg_stat_bgwriter b
""")

# Each figure: (name in the report, counter, scale)
FIGURES = (
    ("drain WAL bytes/delivery", "wal_bytes", 1.0),
    ("drain full-page images/1k deliveries", "wal_fpi", 1000.0),
    ("drain backend buffer writes/1k deliveries", "backend_writes", 1000.0),
    ("drain checkpoints during", "checkpoints", None),
)


def counters(engine: Engine) -> dict[str, float]:
    with engine.connect() as conn:
        return dict(conn.execute(_COUNTERS).mappings().one())


def per_delivery(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """The figures of one drain of ``n`` effects; checkpoints as a count, not a rate."""
    return {
        name: (after[c] - before[c]) * scale / n if scale else after[c] - before[c]
        for name, c, scale in FIGURES
    }


WAL_COMPRESSION = ("off", "pglz", "lz4", "zstd")


@contextmanager
def wal_compression(database: str, method: str | None) -> Iterator[None]:
    """``wal_compression`` set cluster-wide for the run (``ALTER SYSTEM``, reloaded; reset
    after): full-page images compressed. Needs the bench cluster's superuser."""
    if method is None:
        yield
        return
    if method not in WAL_COMPRESSION:
        raise ValueError(f"--wal-compression {method!r}: one of {', '.join(WAL_COMPRESSION)}")
    admin = history_cluster.admin_url(database)
    if admin is None:
        raise SystemExit("--wal-compression needs the bench's own cluster (no DATABASE_URL)")
    engine = db.create_engine(admin, pool_size=1)

    def alter(statement: str) -> None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(statement))
            conn.execute(sa.text("SELECT pg_reload_conf()"))

    try:
        alter(f"ALTER SYSTEM SET wal_compression = '{method}'")  # one of WAL_COMPRESSION
        print(f"wal_compression = {method} (ALTER SYSTEM, reloaded)", flush=True)
        yield
    finally:
        alter("ALTER SYSTEM RESET wal_compression")
        engine.dispose()
