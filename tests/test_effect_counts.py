"""The kept effect counts (core.counts, objects/counts.sql) equal a count of the visible
effects after any sequence of the changes the outbox makes: enqueue, a Spark run's
COPY and its commit or sweep, claims, records, cancels, requeues, purges, folds and
TRUNCATE; and the migration counts the effects that were there before it."""

from __future__ import annotations

import datetime as dt
import io
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools import history, scratch
from spark_outbox.console import operations
from spark_outbox.core import counts, db
from spark_outbox.core.enqueue import enqueue
from spark_outbox.dispatch import retention, store
from tests.conftest import insert_endpoint

ENDPOINTS = ("hook-a", "hook-b")

LIVE = sa.text("SELECT endpoint, state, count(*) FROM visible_effects GROUP BY endpoint, state")


def _live(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        return {(e, s): int(n) for e, s, n in conn.execute(LIVE)}


def _kept(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        return counts.by_endpoint_and_state(conn)


class Outbox:
    """The changes, each through the code (or, for a Spark run, the SQL) that makes it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.serial = 0
        self.runs: list[uuid.UUID] = []  # written, no marker yet
        self.leased: list[store.Claimed] = []

    def _key(self) -> str:
        self.serial += 1
        return f"{self.serial:064x}"

    def enqueue(self, n: int, endpoint: int) -> None:
        with self.engine.begin() as conn:
            for _ in range(n):
                enqueue(
                    conn,
                    idempotency_key=self._key(),
                    endpoint=ENDPOINTS[endpoint],
                    payload={"n": self.serial},
                )

    def write_run(self, n: int, endpoint: int) -> None:
        """What a sink's executor does: COPY the run's rows straight into effects."""
        run = uuid.uuid4()
        with self.engine.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO batch_runs (run_id, job, batch_id) VALUES (:r, 'job', :b)"),
                {"r": run, "b": str(run)},
            )
            rows = "".join(
                f"job\t{run}\t{run}\t{self._key()}\t{ENDPOINTS[endpoint]}\t{{}}\tx\n"
                for _ in range(n)
            )
            cursor = conn.connection.cursor()
            cursor.copy_expert(
                "COPY effects (job, batch_id, run_id, idempotency_key, endpoint, payload,"
                " payload_sha256) FROM STDIN",
                io.StringIO(rows),
            )
        self.runs.append(run)

    def commit_run(self) -> None:
        if self.runs:
            run = self.runs.pop(0)
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text("INSERT INTO batches (job, batch_id, run_id) VALUES ('job', :b, :r)"),
                    {"r": run, "b": str(run)},
                )
                conn.execute(sa.text("DELETE FROM batch_runs WHERE run_id = :r"), {"r": run})

    def sweep_run(self) -> None:
        if self.runs:
            run = self.runs.pop()
            with self.engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM effects WHERE run_id = :r"), {"r": run})
                conn.execute(sa.text("DELETE FROM batch_runs WHERE run_id = :r"), {"r": run})

    def claim(self, n: int) -> None:
        self.leased += store.claim(self.engine, "w", n, 60.0)

    def record(self, n: int, outcome: str) -> None:
        done, self.leased = self.leased[:n], self.leased[n:]
        now = dt.datetime.now(dt.UTC)
        store.record(
            self.engine,
            "w",
            [
                store.Result(c.id, c.lease_token, c.attempt, outcome, now, 1.0, delay_s=0.0)
                for c in done
            ],
        )

    def _one(self, state: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT idempotency_key FROM visible_effects WHERE state = :s LIMIT 1"),
                {"s": state},
            ).scalar()

    def cancel(self) -> None:
        if key := self._one("pending"):
            with self.engine.begin() as conn:
                operations.cancel(conn, key, actor="test", reason="counts")

    def requeue(self) -> None:
        if key := self._one("dead"):
            with self.engine.begin() as conn:
                operations.requeue(conn, key, actor="test", reason="counts")

    def purge(self) -> None:
        retention.purge_batch(self.engine, "purge_batch", dt.datetime.now(dt.UTC), 5)

    def fold(self) -> None:
        with self.engine.begin() as conn:
            counts.fold(conn)

    def truncate(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE effects, delivery_attempts, key_ledger"))
        self.leased.clear()


n = st.integers(1, 6)
endpoint = st.integers(0, len(ENDPOINTS) - 1)
CHANGES = st.one_of(
    st.tuples(st.just("enqueue"), n, endpoint),
    st.tuples(st.just("write_run"), n, endpoint),
    st.tuples(st.just("commit_run")),
    st.tuples(st.just("sweep_run")),
    st.tuples(st.just("claim"), n),
    st.tuples(st.just("record"), n, st.sampled_from(["delivered", "retry", "dead", "uncertain"])),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("requeue")),
    st.tuples(st.just("purge")),
    st.tuples(st.just("fold")),
    st.tuples(st.just("truncate")),
)


@pytest.fixture
def outbox_engine(engine: Engine) -> Engine:
    for name in ENDPOINTS:
        insert_endpoint(engine, name)
    return engine


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.lists(CHANGES, min_size=1, max_size=14))
def test_the_kept_counts_equal_a_count_of_the_visible_effects_after_any_changes(
    outbox_engine: Engine, changes: list[tuple[object, ...]]
) -> None:
    outbox = Outbox(outbox_engine)
    outbox.truncate()  # each example starts empty (and TRUNCATE resets the counts)
    for name, *args in changes:
        getattr(outbox, str(name))(*args)
        assert _kept(outbox_engine) == _live(outbox_engine), (name, args)


def test_a_runs_effects_count_once_its_marker_exists_and_never_after_a_sweep(
    outbox_engine: Engine,
) -> None:
    outbox = Outbox(outbox_engine)
    outbox.write_run(4, 0)
    outbox.write_run(3, 1)
    assert _kept(outbox_engine) == {}  # written, invisible
    outbox.commit_run()
    assert _kept(outbox_engine) == {("hook-a", "pending"): 4}
    outbox.sweep_run()
    outbox.fold()
    assert _kept(outbox_engine) == {("hook-a", "pending"): 4}
    with outbox_engine.connect() as conn:
        # folded: one row for the committed run's effects, none for the swept run's
        rows = conn.execute(sa.text("SELECT endpoint, state, run_id, n FROM effect_counts"))
        assert [tuple(r) for r in rows] == [("hook-a", "pending", None, 4)]


def test_a_fold_leaves_one_row_per_endpoint_and_state(outbox_engine: Engine) -> None:
    outbox = Outbox(outbox_engine)
    for _ in range(5):
        outbox.enqueue(3, 0)
        outbox.claim(2)
        outbox.record(2, "delivered")
    with outbox_engine.connect() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM effect_counts")).scalar_one()
    outbox.fold()
    with outbox_engine.connect() as conn:
        after = conn.execute(sa.text("SELECT count(*) FROM effect_counts")).scalar_one()
    # 5 x (3 enqueues: a row each; a claim and a record: two rows each) -> 2 rows
    assert (before, after) == (35, 2)
    assert _kept(outbox_engine) == {("hook-a", "pending"): 5, ("hook-a", "delivered"): 10}


@pytest.fixture
def at_1804(server_url: str) -> Iterator[str]:
    url = scratch.create_empty_database(server_url)
    try:
        db.upgrade(url, "1804")
        yield url
    finally:
        scratch.drop_database(server_url, scratch.database_name(url))


def test_the_migration_counts_the_effects_that_were_there_before_it(at_1804: str) -> None:
    engine = db.create_engine(at_1804, pool_size=2)
    try:
        history.load(engine, effects=3000, chunk=1000)
        db.upgrade(at_1804)
        assert _kept(engine) == _live(engine)
        assert sum(_kept(engine).values()) == 3000
    finally:
        engine.dispose()
