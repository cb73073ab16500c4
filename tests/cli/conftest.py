"""In-process CLI runs: ``main`` configures logging for the process, so it is put back."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def in_db(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's database as DATABASE_URL (a URL with a password stays off argv)."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("OUTBOX_SSRF_ALLOW_NETWORKS", raising=False)
    return db_url
