"""One SparkSession (local[2]) for the whole Spark test run: it takes seconds to start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_outbox.billing.session import build_session
from tests.dispatcher.conftest import receiver  # noqa: F401  (the same fixture here)


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
