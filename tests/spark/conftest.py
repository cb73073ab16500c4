"""One SparkSession (local[2]) for the whole Spark test run: it takes seconds to start.
One standalone cluster too (a master and two one-core workers: three JVMs, the
better part of a minute to start on a busy machine), for every test that runs a job
on one; each test gets it idle (no executor of an earlier job left)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_outbox.billing.session import build_session
from tests.dispatcher.conftest import fast, receiver  # noqa: F401  (the same fixtures here)
from tests.otlp import otlp  # noqa: F401  (tracing to a receiver on loopback)


@pytest.fixture(autouse=True)
def no_driver_left() -> Iterator[None]:
    """Whatever a test does, no driver process it started outlives it."""
    from tests.spark.killing import Driver

    try:
        yield
    finally:
        Driver.stop_all()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_session("spark-outbox-tests")
    yield session
    session.stop()


@pytest.fixture
def second_db(server_url: str, template_name: str) -> Iterator[tuple[str, Any]]:
    """Another fresh database, for comparing two runs side by side."""
    from spark_outbox.cli.tools import scratch
    from spark_outbox.core import db

    url = scratch.clone_template(server_url, template_name)
    engine = db.create_engine(url)
    yield url, engine
    engine.dispose()
    scratch.drop_database(server_url, scratch.database_name(url))


@pytest.fixture(scope="session")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python for cluster executors like docs/spark.md's: a fresh venv with the
    executors' requirements (``outbox spark package``) and not this package, which
    the executors must then receive from the driver. Built once per test session."""
    from spark_outbox.spark import shipping

    venv = tmp_path_factory.mktemp("executor-python")
    requirements = shipping.build(tmp_path_factory.mktemp("package")).requirements_path
    python = venv / "bin" / "python"
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no repository
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    for command in (
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        [*pip, "--disable-pip-version-check", "-r", str(requirements)],
    ):
        done = subprocess.run(command, env=alone, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
    lacks = subprocess.run(
        [str(python), "-c", "import spark_outbox"],
        cwd=venv,
        env=alone,
        capture_output=True,
        text=True,
    )
    assert "No module named 'spark_outbox'" in lacks.stderr, lacks
    return python


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark Connect server (local[2]) for the tests that need no kill of it."""
    from spark_outbox.cli.tools.connectserver import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("connect"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two one-core workers, so executors are separate JVMs that can die on their own.
    No PYTHONPATH reaches the executors: this repository is not on their path. What a
    test wants of its executors (a pause at a phase) it asks per job, with
    ``spark.executorEnv`` (``executor_env``), not of the shared workers."""
    from spark_outbox.cli.tools.sparkcluster import StandaloneCluster

    cluster = StandaloneCluster(
        tmp_path_factory.mktemp("cluster"), workers=2, env={"PYTHONPATH": None}
    )
    try:
        yield cluster.start(timeout_s=300)
    finally:
        cluster.stop()


@pytest.fixture
def cluster(standalone_cluster: Any) -> Any:
    """The shared cluster once it is idle: both workers alive and every executor of an
    earlier job gone (its workers end them after the job; that takes a moment)."""
    deadline = time.monotonic() + 120
    while standalone_cluster.executor_pids() or standalone_cluster.alive_workers() != 2:
        assert time.monotonic() < deadline, (
            f"cluster not idle: executors {standalone_cluster.executor_pids()}, "
            f"{standalone_cluster.alive_workers()} workers alive"
        )
        time.sleep(0.2)
    return standalone_cluster
