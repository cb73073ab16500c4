"""One SparkSession (local[2]) for the whole Spark test run: it takes seconds to start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_jobs.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_session("spark-outbox-tests")
    yield session
    session.stop()


@pytest.fixture
def second_db(server_url: str, template_name: str) -> Iterator[tuple[str, Any]]:
    """Another fresh database, for comparing two runs side by side."""
    from dispatcher import db
    from tests.support import databases

    url = databases.create_test_database(server_url, template_name)
    engine = db.create_engine(url)
    yield url, engine
    engine.dispose()
    databases.drop_database(server_url, url)
