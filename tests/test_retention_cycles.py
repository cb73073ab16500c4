"""Retention keeps the outbox's size flat: month after month of finished history is
purged and a new month written in its place, and the tables (heap, TOAST, indexes)
end each cycle the size they ended the first one. The same cycles at 10M effects
are ``python -m bench retention``."""

from __future__ import annotations

import datetime as dt
import re
import time

import psycopg2
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools import history
from spark_outbox.core import db
from spark_outbox.dispatch import retention

MONTH_EFFECTS = 3000
TABLES = ("effects", "delivery_attempts", "key_ledger")


def _size_bytes(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT sum(pg_total_relation_size(CAST(t AS regclass))) FROM unnest(:t) t"
                ),
                {"t": list(TABLES)},
            ).scalar_one()
        )


def _oldest_finish(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        oldest: dt.datetime = conn.execute(
            sa.text(
                "SELECT min(updated_at) FROM effects"
                " WHERE state IN ('delivered', 'dead', 'cancelled')"
            )
        ).scalar_one()
    return oldest


def _vacuum(engine: Engine) -> None:
    """VACUUM the tables until no row they hold is dead but not yet removable, as
    autovacuum would come back: a snapshot another session still holds (autovacuum's
    own ANALYZE of a table just loaded, on a busy machine) keeps the rows a purge
    deleted until it ends, and a VACUUM that ran under it reclaims nothing."""
    pending = re.compile(r"(\d+) are dead but not yet removable")
    deadline = time.monotonic() + 60
    while True:
        # A connection of its own, with the driver's cursor: SQLAlchemy's clears the
        # server's notices, which is where VACUUM (VERBOSE) reports.
        raw = psycopg2.connect(db.libpq_url(engine.url.render_as_string(hide_password=False)))
        try:
            raw.autocommit = True
            raw.cursor().execute(f"VACUUM (VERBOSE) {', '.join(TABLES)}")
            report = "".join(raw.notices)
        finally:
            raw.close()
        kept = sum(int(n) for n in pending.findall(report))
        assert pending.search(report), report  # the report's wording is what we read
        if kept == 0:
            return
        assert time.monotonic() < deadline, report
        time.sleep(0.5)


def _cycle(engine: Engine, c: int) -> int:
    """Purge the oldest month (effects, attempts, the ledger's keys of the month),
    VACUUM as autovacuum would, write a new month; the size after."""
    cutoff = _oldest_finish(engine) + dt.timedelta(days=30)
    done = retention.purge(engine, cutoff, 1000, horizon=cutoff)
    assert done.effects > MONTH_EFFECTS // 2, done  # a month went
    _vacuum(engine)
    first = 12 * MONTH_EFFECTS + c * MONTH_EFFECTS + 1
    history.load(engine, effects=MONTH_EFFECTS, days=30, first=first, per_batch=10, chunk=3000)
    return _size_bytes(engine)


def test_the_outbox_stays_the_same_size_over_repeated_fill_and_purge_cycles(
    engine: Engine,
) -> None:
    history.load(engine, effects=12 * MONTH_EFFECTS, days=360, per_batch=10, chunk=12_000)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
    sizes = [_cycle(engine, c) for c in range(5)]
    # Deleted rows are reused once VACUUM has passed: no cycle after the first
    # leaves the tables more than 5% larger (without the VACUUM, each grew them ~7%).
    assert max(sizes[1:]) <= sizes[0] * 1.05, sizes
