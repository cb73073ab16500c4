"""A settings object shows no database password: it ends up in logs, tracebacks and
debuggers. Code that reads the field still gets the whole URL."""

from __future__ import annotations

import dataclasses

import pytest

from spark_outbox.core.settings import Settings


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://outbox:s3cret-pw@db.internal:5432/outbox",
        "postgres://outbox:s3cret-pw@db.internal/outbox",
        "postgresql://outbox@db.internal/outbox?password=s3cret-pw&sslmode=require",
        "postgresql://outbox:s3cret-pw@db.internal:not-a-port/outbox",
    ],
)
def test_repr_and_str_of_the_settings_hide_the_database_password(url: str) -> None:
    # (Built past from_env's checks: one that does not parse is refused there, unshown.)
    settings = dataclasses.replace(
        Settings.from_env({"HOME": "/nonexistent"}), database_url=url, listen_database_url=url
    )
    assert settings.database_url == url == settings.listen_database_url
    for shown in (repr(settings), str(settings), f"{settings}", f"{settings!r}"):
        assert "s3cret-pw" not in shown
        assert shown.startswith("Settings(database_url=")


def test_the_settings_repr_still_says_which_database_and_every_other_field() -> None:
    settings = Settings.from_env(
        {"DATABASE_URL": "postgresql://outbox:pw@db.internal:5432/outbox", "HOME": "/x"}
    )
    shown = repr(settings)
    assert "db.internal:5432/outbox" in shown and "outbox:***@" in shown
    assert "concurrency=128" in shown and "api_port=8000" in shown
    assert "database_url=''" in repr(Settings(database_url=""))
