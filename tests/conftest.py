"""Shared fixtures: a real PostgreSQL and a fresh migrated database per test.

``DATABASE_URL`` set: tests create their databases on that server (the role
needs CREATEDB). Unset: the test suite's own private cluster, under ``.outbox``
in the repository, is started (or reused) from the machine's PostgreSQL binaries;
never the developer's per-user one (``~/.local/state/spark-outbox``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db
from spark_outbox.core.settings import Settings
from tests import ROOT

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The test suite's private cluster: the fixtures name it, and every `outbox` process a
# test starts without DATABASE_URL inherits it, instead of the per-user default.
TEST_STATE_DIR = ROOT / ".outbox"
os.environ["OUTBOX_STATE_DIR"] = str(TEST_STATE_DIR)
# Every JVM the tests start (the local session, drivers, executors, the cluster's and a
# Connect server's daemons) compiles with C1 only: the tests' jobs last seconds, and C2's
# compiler threads were a third of their CPU (a six-day billing driver: 45.7 s of CPU and
# 27.2 s of wall time by default, 28.4 s and 22.7 s with C1 only, 2026-11-27). Outside
# the tests (benches, `make demo`, production) the JVM keeps its defaults; set
# JDK_JAVA_OPTIONS to override it here.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the root logger back after each test.

    ``spark_outbox.cli.main.main`` configures logging for its process (a handler on the
    current ``sys.stderr``). Called in-process, that stderr is the test's capture,
    closed when the test ends; the handler left behind made py4j's goodbye at
    interpreter exit print "--- Logging error --- ValueError: I/O operation on
    closed file" after the Spark tests.
    """
    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    handlers, level, alembic_level = root.handlers[:], root.level, alembic.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    alembic.setLevel(alembic_level)


# `make test` runs the suite in two processes (pytest-xdist), one per core of the
# machine it must fit (the Makefile says what that measured). The
# private cluster is shared by both: the first process (the controller, or the only one
# without xdist) starts it before any test and stops it after the last, if it had to
# start it; one that was already running (a developer's) is left running. Tests are
# dealt out a file at a time (`--dist loadfile`): a file's tests share its module
# fixtures and run in its order, and every test on the session's standalone cluster
# (three JVMs, started once a process) is in tests/spark/test_cluster.py.
_STARTED_CLUSTER = pytest.StashKey[PrivateCluster]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_xdist_worker(session.config):
        return
    settings = Settings.from_env(state_dir=TEST_STATE_DIR)
    if settings.database_url:
        return
    cluster = PrivateCluster(settings.state_dir)
    if not cluster.status()[0]:
        cluster.ensure_running()
        session.config.stash[_STARTED_CLUSTER] = cluster


def pytest_sessionfinish(session: pytest.Session) -> None:
    cluster = session.config.stash.get(_STARTED_CLUSTER, None)
    if cluster is not None:
        cluster.stop()


# The files that take longest, longest first (measured in one process on a quiet machine,
# 2026-11-27): started first, they overlap each other and the short files fill in after
# them; started last (their place in collection order), one process ran two of them alone
# at the end. Only the order changes, never what runs; a file not named keeps its place.
_LONGEST_FIRST = (
    "tests/spark/test_cluster.py",  # ~230 s: three drills on the standalone cluster
    "tests/spark/test_kill.py",  # ~150 s
    "tests/spark/test_source_kill.py",  # ~110 s
    "tests/demo/test_demo.py",  # ~70 s
    "tests/test_install.py",  # ~45 s
    "tests/spark/test_connect_kill.py",  # ~45 s
    "tests/upgrade/test_drill.py",  # ~40 s
    "tests/spark/test_connect.py",  # ~35 s
    "tests/spark/test_billing.py",  # ~35 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def server_url() -> str:
    """A URL to a PostgreSQL server where tests may create databases: ``DATABASE_URL``,
    or the private cluster ``pytest_sessionstart`` made sure runs."""
    settings = Settings.from_env(state_dir=TEST_STATE_DIR)
    if settings.database_url:
        return settings.database_url
    return PrivateCluster(settings.state_dir).ensure_running().url


@pytest.fixture(scope="session")
def template_name(server_url: str) -> str:
    return scratch.ensure_template(server_url)


@pytest.fixture
def db_url(server_url: str, template_name: str) -> Iterator[str]:
    """A fresh database at migration head, dropped after the test."""
    url = scratch.clone_template(server_url, template_name)
    yield url
    scratch.drop_database(server_url, scratch.database_name(url))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = db.create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    """Settings for code under test: the test's database, loopback allowed."""
    return Settings.from_env(
        env={},
        database_url=db_url,
        state_dir=tmp_path / "state",
        ssrf_allow_networks=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")),
        log_format="text",
    )


def insert_endpoint(engine: Engine, name: str, **values: object) -> None:
    """Register an endpoint directly (tests of code that only needs one to exist)."""
    from spark_outbox.core.schema import endpoints

    row: dict[str, object] = {
        "name": name,
        "kind": "webhook",
        "url": "http://127.0.0.1:9/hook",
        "signing_secret": "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0",
    }
    row.update(values)
    with engine.begin() as conn:
        conn.execute(sa.insert(endpoints).values(**row))


def insert_billing_endpoints(engine: Engine, *, smtp_password: str | None = None) -> None:
    """The example job's two endpoints: ``billing-webhook`` and ``billing-email``."""
    insert_endpoint(engine, "billing-webhook")
    insert_endpoint(
        engine,
        "billing-email",
        kind="email",
        url=None,
        signing_secret=None,
        smtp_host="127.0.0.1",
        smtp_port=2525,
        mail_from="billing@example.com",
        smtp_password=smtp_password,
    )
