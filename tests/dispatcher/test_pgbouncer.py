"""Behind a real PgBouncer in transaction pooling mode: producers, two dispatcher
processes, the API and `outbox verify` all go through the pooler, and every key is
delivered once. (The Spark sink's run through it: tests/spark/test_pooler.py.)"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.console import tokens
from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver
from tests.invariants import assert_invariants
from tests.pooler import PgBouncer, binary

pytestmark = pytest.mark.slow


@pytest.fixture
def pooled(db_url: str) -> Iterator[str]:
    if binary() is None:
        pytest.skip("PgBouncer is fetched with apt-get download: needs Debian's apt-get")
    bouncer = PgBouncer(db_url, pool_mode="transaction", pool_size=4).start()
    try:
        yield bouncer.url(db_url)
    finally:
        bouncer.stop()


def test_producers_dispatchers_api_and_verify_work_through_transaction_pooling(
    pooled: str, engine: Engine, receiver: Receiver, settings: Settings, tmp_path: Path
) -> None:
    _settings_on_the_database(engine)  # before the pooler opens a server connection
    through = db.create_engine(pooled)
    try:
        with through.begin() as conn:
            add_webhook(conn, name="hook", url=receiver.url())
            for i in range(300):  # enqueue() in the producer's own transactions
                enqueue(conn, idempotency_key=effect_key("pool", i), endpoint="hook", payload={})
        keys = [effect_key("pool", i) for i in range(300)] + procs.enqueue_many(through, 1700)
        # Server-side prepared statements do not survive transaction pooling, and
        # PgBouncer refuses connection options: the database carries the settings.
        env = procs.worker_env(
            pooled,
            OUTBOX_PREPARED_STATEMENTS="0",
            OUTBOX_STARTUP_OPTIONS="0",
            OUTBOX_LOG_LEVEL="INFO",
        )
        logs = [tmp_path / f"w{i}.log" for i in range(2)]
        workers = [
            procs.start(env | {"OUTBOX_WORKER_ID": f"w{i}"}, "--until-idle", log=logs[i])
            for i in range(2)
        ]
        codes = [w.wait(120) for w in workers]
        assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
        assert not any("dispatcher.role_settings" in log.read_text() for log in logs)
        seen = collections.Counter(receiver.keys())
        assert set(seen) == set(keys) and max(seen.values()) == 1
        assert procs.states(engine) == {"delivered": 2000}
        api = dataclasses.replace(settings, database_url=pooled, prepared_statements=False)
        with through.begin() as conn:
            _, token = tokens.create(conn, name="olga", role="operator")
        with TestClient(create_app(api), base_url="https://testserver") as client:
            auth = {"Authorization": f"Bearer {token}"}
            status = client.get("/v1/status", headers=auth)
            assert status.status_code == 200 and status.json()["counts"]["delivered"] == 2000
            effect = client.get(f"/v1/effects/{keys[0]}", headers=auth)
            assert effect.status_code == 200 and effect.json()["effect"]["state"] == "delivered"
        # The whole history read through the pooler, in one session of many transactions.
        assert_invariants(through)
    finally:
        through.dispose()
    with engine.connect() as conn:  # nothing was left half-done on a pooled connection
        assert conn.execute(sa.text("SELECT count(*) FROM delivery_attempts")).scalar() == 2000


def test_a_dispatcher_behind_the_pooler_is_woken_through_its_direct_listen_url(
    pooled: str, db_url: str, engine: Engine, receiver: Receiver, tmp_path: Path
) -> None:
    through = db.create_engine(pooled)
    env = procs.worker_env(
        pooled,
        OUTBOX_PREPARED_STATEMENTS="0",
        OUTBOX_STARTUP_OPTIONS="0",
        OUTBOX_LOG_LEVEL="INFO",
        OUTBOX_LISTEN_DATABASE_URL=db_url,  # the one LISTEN, straight to PostgreSQL
        OUTBOX_POLL_INTERVAL_S="60",  # so only a wake-up can explain a quick delivery
    )
    log = tmp_path / "w.log"
    worker = procs.start(env | {"OUTBOX_WORKER_ID": "w"}, log=log)
    try:
        with through.begin() as conn:
            add_webhook(conn, name="hook", url=receiver.url())
        procs.wait_for(lambda: "listener" in _listening(engine), 30, "the listener")
        with through.begin() as conn:
            enqueue(conn, idempotency_key=effect_key("wake", 1), endpoint="hook", payload={})
        procs.wait_for(lambda: len(receiver.seen()) == 1, 10, "a delivery woken by NOTIFY")
    finally:
        assert procs.stop(worker) == 0, log.read_text()[-2000:]
        through.dispose()
    # The role (here: the database) lacks the dispatcher's settings: said, with the fix.
    warned = [json.loads(line) for line in log.read_text().splitlines() if "role_settings" in line]
    assert warned and "ALTER ROLE <dispatcher role> SET enable_sort = off;" in warned[0]["msg"]


def test_connection_options_refused_by_the_pooler_are_a_one_line_error_not_a_retry_loop(
    pooled: str, tmp_path: Path
) -> None:
    env = procs.worker_env(pooled, OUTBOX_PREPARED_STATEMENTS="0")  # options still on
    log = tmp_path / "w.log"
    worker = procs.start(env, "--until-idle", log=log)
    try:
        code = worker.wait(30)
    finally:
        procs.stop(worker)
    text = log.read_text()
    assert code == 2, text[-2000:]
    assert "OUTBOX_STARTUP_OPTIONS=0" in text and "unsupported startup parameter" in text
    assert "Traceback" not in text and "db.retry" not in text


def _settings_on_the_database(engine: Engine) -> None:
    """What ``ALTER ROLE dispatcher SET ...`` does in production, scoped to the test's
    database so the other tests' connections keep the defaults."""
    with engine.connect() as conn:
        name = conn.execute(sa.text("SELECT current_database()")).scalar_one()
        conn.execute(sa.text("COMMIT"))
        for k, v in store.SESSION_SETTINGS.items():
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET {k} = {v}')


def _listening(engine: Engine) -> str:
    """The application names of the sessions that LISTEN (straight to PostgreSQL)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
            )
        )
        return " ".join(r[0] for r in rows)
