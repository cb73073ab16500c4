"""queue_stats (the depth behind /v1/status and every scrape) runs without JIT, for
its own transaction only: compiling the count cost more than the count itself beside
a large backlog (bench/RESULTS.md), and a session-wide SET would leak to the next
client of a PgBouncer server connection."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.queue import queue_stats

JIT = sa.text("SELECT current_setting('jit')")


def test_the_depth_is_counted_without_jit_and_the_setting_ends_with_the_transaction(
    engine: Engine,
) -> None:
    with engine.connect() as conn:
        # JIT on for the session, whatever the server's default (a DATABASE_URL's server
        # may have it off): otherwise the test could not tell the change from the setting.
        conn.execute(sa.text("SET jit = on"))
        conn.commit()
        assert conn.execute(JIT).scalar_one() == "on"
        conn.rollback()
        stats = queue_stats(conn)
        assert conn.execute(JIT).scalar_one() == "off"
        conn.rollback()
        assert conn.execute(JIT).scalar_one() == "on"
    assert stats.depth == 0
    assert stats.oldest_due_age_s == 0.0
