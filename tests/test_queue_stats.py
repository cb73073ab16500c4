"""queue_stats (the depth behind /v1/status and every scrape) runs without JIT, for
its own transaction only: compiling the count cost more than the count itself beside
a large backlog (bench/RESULTS.md), and a session-wide SET would leak to the next
client of a PgBouncer server connection."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core import queue
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.queue import Queue, queue_stats
from tests.conftest import insert_endpoint
from tests.test_effect_counts import CHANGES, Outbox, outbox_engine  # noqa: F401

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


# -- beyond the exact count: the queue's snapshot (core/queue.py, migration 2813) -----

CAP = 5  # the exact count's bound, small here (EXACT_UP_TO in production)


def _enqueue(engine: Engine, endpoint: str, n: int, start: int = 0) -> None:
    with engine.begin() as conn:
        for i in range(start, start + n):
            key = effect_key("queue-test", endpoint, i)
            enqueue(conn, idempotency_key=key, endpoint=endpoint, payload={"i": i})


def _figures(engine: Engine, refresh_after_s: float = 60.0) -> Queue:
    with engine.begin() as conn:
        return queue.queue(conn, refresh_after_s=refresh_after_s, cap=CAP)


@pytest.fixture
def two_endpoints(engine: Engine) -> Engine:
    insert_endpoint(engine, "hooks")
    insert_endpoint(engine, "more-hooks")
    return engine


def test_below_the_bound_the_figures_are_counted_live_and_exact(two_endpoints: Engine) -> None:
    _enqueue(two_endpoints, "hooks", 2)
    _enqueue(two_endpoints, "more-hooks", 2)
    first = _figures(two_endpoints)
    assert first.total.depth == 4 and first.total.as_of is None
    assert {n: s.depth for n, s in first.endpoints.items()} == {"hooks": 2, "more-hooks": 2}
    with two_endpoints.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM queue_snapshot")).scalar_one() == 0
    _enqueue(two_endpoints, "hooks", 1, start=2)  # 5 due: the bound reached
    assert _figures(two_endpoints).endpoints["hooks"].depth == 3


def test_beyond_the_bound_a_full_count_is_kept_and_read_until_it_is_due_again(
    two_endpoints: Engine,
) -> None:
    _enqueue(two_endpoints, "hooks", 6)
    _enqueue(two_endpoints, "more-hooks", 3)
    taken = _figures(two_endpoints)
    assert taken.total.depth == 9, "the full count, not the bound"
    assert {n: s.depth for n, s in taken.endpoints.items()} == {"hooks": 6, "more-hooks": 3}
    assert taken.total.as_of is not None
    assert taken.total.oldest_due_age_s > 0.0
    # More arrive: a reader within the refresh interval reads the kept figures, as of then.
    _enqueue(two_endpoints, "more-hooks", 4, start=3)
    kept = _figures(two_endpoints)
    assert (kept.total.depth, kept.total.as_of) == (9, taken.total.as_of)
    # A reader whose interval has passed (a dispatcher's heartbeat) counts again.
    again = _figures(two_endpoints, refresh_after_s=0.0)
    assert again.total.depth == 13 and again.endpoints["more-hooks"].depth == 7
    assert again.total.as_of is not None and again.total.as_of > taken.total.as_of
    # Drained below the bound: live and exact again, whatever the snapshot says.
    with two_endpoints.begin() as conn:
        conn.execute(sa.text("UPDATE effects SET state = 'cancelled' WHERE endpoint = 'hooks'"))
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'dead' WHERE endpoint = 'more-hooks'"
                " AND id > (SELECT min(id) + 3 FROM effects WHERE endpoint = 'more-hooks')"
            )
        )
    live = _figures(two_endpoints)
    assert (live.total.depth, live.total.as_of) == (4, None)


def test_a_snapshot_too_old_is_never_read_and_a_reader_never_waits_for_anothers_count(
    two_endpoints: Engine,
) -> None:
    _enqueue(two_endpoints, "hooks", 7)
    assert _figures(two_endpoints).total.depth == 7
    with two_endpoints.begin() as conn:
        conn.execute(sa.text("UPDATE queue_snapshot SET taken_at = now() - interval '1 hour'"))
    _enqueue(two_endpoints, "hooks", 1, start=7)
    # Another reader holds the turn (its count under way): this one neither waits for
    # it nor reads the hour-old figures: it counts, live.
    with two_endpoints.connect() as other:
        other.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": queue._SNAPSHOT_LOCK})
        with two_endpoints.begin() as conn:
            conn.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
            figures = queue.queue(conn, refresh_after_s=60.0, cap=CAP)
        assert (figures.total.depth, figures.total.as_of) == (8, None)
        other.rollback()
    # The turn free again: the reader takes the snapshot anew.
    assert _figures(two_endpoints).total.as_of is not None
    assert _figures(two_endpoints).total.depth == 8


def test_out_of_turn_the_full_count_is_skipped_not_filtered(two_endpoints: Engine) -> None:
    _enqueue(two_endpoints, "hooks", 6)
    assert _figures(two_endpoints).total.as_of is not None  # a snapshot, fresh
    refresh = queue._Q["refresh_snapshot"].text
    params = {"refresh_after_s": 60.0, "lock_key": queue._SNAPSHOT_LOCK}
    with two_endpoints.begin() as conn:
        plan = conn.execute(sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {refresh}"), params)
        root = plan.scalar_one()[0]["Plan"]

    def scans(node: dict) -> list[dict]:  # type: ignore[type-arg]
        found = [node] if node.get("Relation Name") == "effects" else []
        return found + [s for child in node.get("Plans", []) for s in scans(child)]

    effects_scans = scans(root)
    assert effects_scans, "the plan reads effects somewhere"
    assert all(s["Actual Loops"] == 0 for s in effects_scans), effects_scans


def _counted(engine: Engine) -> dict[str, tuple[int, float]]:
    with engine.begin() as conn:
        conn.execute(queue._Q["without_jit"])
        return {r[0]: (int(r[1]), float(r[2])) for r in conn.execute(queue._Q["count_all"])}


@settings(
    max_examples=25,
    deadline=None,
    # a fixture's database shared by the examples (each starts by emptying it), and slow
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    changes=st.lists(CHANGES, min_size=1, max_size=12),
    cap=st.integers(1, 12),
    refresh=st.booleans(),
)
def test_the_figures_equal_a_full_count_after_any_changes_whatever_the_bound(
    outbox_engine: Engine,  # noqa: F811 (the fixture imported above)
    changes: list[tuple[object, ...]],
    cap: int,
    refresh: bool,
) -> None:
    """Counted live below the bound, the snapshot beyond it: the figures are always a
    full count's, per endpoint and in all: this moment's when live or just taken
    (``refresh``: every read takes one), else the one of the moment it was taken."""
    hooks = outbox_engine
    outbox = Outbox(hooks)
    outbox.truncate()
    with hooks.begin() as conn:
        conn.execute(sa.text("DELETE FROM queue_snapshot"))
    at_taking: dict[object, dict[str, tuple[int, float]]] = {}
    for name, *args in changes:
        getattr(outbox, str(name))(*args)
        with hooks.begin() as conn:
            figures = queue.queue(conn, refresh_after_s=0.0 if refresh else 3600.0, cap=cap)
        now = _counted(hooks)
        as_of = figures.total.as_of
        if as_of is None:  # below the bound (or no snapshot young enough: counted)
            expected = now
        else:
            expected = at_taking.setdefault(as_of, now)  # first seen: taken by this read
            assert sum(d for d, _ in expected.values()) >= cap, (name, args)
        assert {n: s.depth for n, s in figures.endpoints.items()} == {
            n: d for n, (d, _) in expected.items()
        }, (name, args)
        assert figures.total.depth == sum(d for d, _ in expected.values())
        for n, s in figures.endpoints.items():
            assert abs(s.oldest_due_age_s - expected[n][1]) < 5.0


def test_a_read_only_transaction_beyond_the_bound_reads_or_counts_and_never_writes(
    two_endpoints: Engine,
) -> None:
    _enqueue(two_endpoints, "hooks", 6)
    with two_endpoints.begin() as conn:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        counted = queue.queue(conn, cap=CAP)  # no snapshot yet: counted, not written
    assert (counted.total.depth, counted.total.as_of) == (6, None)
    taken = _figures(two_endpoints)  # a read-write reader takes one
    with two_endpoints.begin() as conn:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        read = queue.queue(conn, refresh_after_s=0.0, cap=CAP)  # due, but cannot write
    assert (read.total.depth, read.total.as_of) == (6, taken.total.as_of)


@pytest.mark.parametrize("figures", ["[]", '{"hooks": "many"}', '{"hooks": [1]}', '"x"', "{}"])
def test_a_snapshot_nobody_could_have_written_is_not_believed(
    two_endpoints: Engine, figures: str
) -> None:
    """A row edited by hand must not fail a status page, or stop every dispatcher at
    its heartbeat: the reader counts instead (an empty snapshot is a fresh count that
    found nothing due, and beyond the bound it is counted again once it is due)."""
    _enqueue(two_endpoints, "hooks", 6)
    with two_endpoints.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO queue_snapshot (id, figures, taken_at)"
                " VALUES (1, CAST(:f AS jsonb), now())"
            ),
            {"f": figures},
        )
    got = _figures(two_endpoints)
    if figures == "{}":  # readable: believed until it is due again
        assert (got.total.depth, got.total.as_of is not None) == (0, True)
        got = _figures(two_endpoints, refresh_after_s=0.0)
    assert got.total.depth == 6 and got.endpoints["hooks"].depth == 6
