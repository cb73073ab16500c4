"""``outbox db upgrade`` beside the traffic: no lock wait longer than its lock timeout
(so nothing queues behind it for longer), tries again after a timeout or a deadlock,
and says when it gave up; an index on a table in use is built CONCURRENTLY, also
over an invalid one an interrupted build left."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import psycopg2
import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from spark_outbox.core import db, revisions
from spark_outbox.core.errors import UpgradeBlocked
from spark_outbox.migrations import online
from tests.upgrade import previous

LOCK_TIMEOUT_S = 0.5


class LongReader:
    """A transaction that read ``effects`` and stays open for ``hold_s`` (a report, a
    slow commit): its lock conflicts with every ALTER of the table."""

    def __init__(self, url: str, hold_s: float) -> None:
        self.conn = psycopg2.connect(db.libpq_url(url))
        self.conn.cursor().execute("SELECT count(*) FROM effects")
        self.timer = threading.Timer(hold_s, self.conn.commit)
        self.timer.start()

    def close(self) -> None:
        self.timer.cancel()
        self.conn.close()


class Traffic:
    """Reads of ``effects`` one after another in a thread; the slowest is kept."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(db.libpq_url(url))
        self.conn.autocommit = True
        self.slowest_s = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        cursor = self.conn.cursor()
        while not self.stopping.is_set():
            started = time.monotonic()
            cursor.execute("SELECT count(*) FROM effects")
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)
            time.sleep(0.02)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.conn.close()


@pytest.fixture
def traffic(old_schema_url: str) -> Iterator[Traffic]:
    busy = Traffic(old_schema_url)
    try:
        yield busy
    finally:
        busy.close()


def test_an_upgrade_behind_a_long_transaction_stalls_no_query_longer_than_its_lock_timeout(
    old_schema_url: str, traffic: Traffic, caplog: pytest.LogCaptureFixture
) -> None:
    reader = LongReader(old_schema_url, hold_s=5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="spark_outbox.core.db"):
            db.upgrade(old_schema_url, lock_timeout_s=LOCK_TIMEOUT_S, tries=100)
    finally:
        reader.close()
    engine = db.create_engine(old_schema_url, pool_size=1)
    try:
        assert revisions.read(engine).current == revisions.head()
    finally:
        engine.dispose()
    # Queued behind the waiting ALTER, a query waits at most its lock timeout (plus the
    # scheduling of a loaded machine), not until the long transaction ends (5 s).
    assert traffic.slowest_s < LOCK_TIMEOUT_S + 1.5, traffic.slowest_s
    retries = [r for r in caplog.records if getattr(r, "event", "") == "db.upgrade_retry"]
    assert retries, "the first tries waited for the long transaction and gave up"


def test_an_upgrade_that_keeps_meeting_the_lock_gives_up_saying_so_and_applies_nothing(
    old_schema_url: str,
) -> None:
    reader = LongReader(old_schema_url, hold_s=30.0)
    try:
        with pytest.raises(UpgradeBlocked, match=r"gave up after 2 tries.*--lock-timeout-s 0"):
            db.upgrade(old_schema_url, lock_timeout_s=0.2, tries=2)
    finally:
        reader.close()
    engine = db.create_engine(old_schema_url, pool_size=1)
    try:
        assert revisions.read(engine).current == previous.recorded().revision
    finally:
        engine.dispose()


def _build(engine: Engine, **kwargs: object) -> str:
    """Build through alembic's operations, as a revision does, on a connection whose
    lock timeout is 7 s (``outbox db upgrade``'s); that connection's timeout after."""
    with engine.connect() as conn:
        conn.execute(sa.text("SET lock_timeout = '7s'"))
        conn.commit()
        try:
            with Operations.context(MigrationContext.configure(conn)):
                online.create_index_concurrently(**kwargs)  # type: ignore[arg-type]
        finally:
            conn.rollback()
            shown = str(conn.execute(sa.text("SHOW lock_timeout")).scalar())
    return shown


def _index(engine: Engine, name: str) -> tuple[bool, str] | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = :n"
            ),
            {"n": name},
        ).first()
        return None if row is None else (bool(row[0]), str(row[1]))


def test_an_index_left_invalid_by_an_interrupted_build_is_built_again(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE probe (n int)"))
        conn.execute(sa.text("INSERT INTO probe VALUES (1), (1)"))
    with pytest.raises(sa.exc.IntegrityError):  # a unique build over duplicates fails...
        _build(engine, name="ix_probe_n", table="probe", columns=["n"], unique=True)
    assert _index(engine, "ix_probe_n") == (
        False,
        "CREATE UNIQUE INDEX ix_probe_n ON public.probe USING btree (n)",
    )
    with engine.begin() as conn:  # ...and leaves an invalid index behind
        conn.execute(sa.text("DELETE FROM probe"))
    after = _build(engine, name="ix_probe_n", table="probe", columns=["n"], unique=True,
                   where="n > 0")  # fmt: skip
    valid, definition = _index(engine, "ix_probe_n") or (False, "")
    assert valid and "WHERE (n > 0)" in definition
    assert after == "7s"  # no lock timeout while it built, the upgrade's put back after
