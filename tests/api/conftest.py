"""API fixtures: the real app (create_app) on a fresh database, tokens of both roles."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from api.app import create_app
from dispatcher import tokens
from dispatcher.settings import Settings
from tests.conftest import insert_endpoint


@dataclasses.dataclass(frozen=True)
class Tokens:
    support: str
    operator: str

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {getattr(self, role)}"}


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, sensitive_fields=("card.pan",))


@pytest.fixture
def endpoints(engine: Engine) -> None:
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
        smtp_password="hunter2-smtp",
    )


@pytest.fixture
def api_tokens(engine: Engine) -> Tokens:
    with engine.begin() as conn:
        _, support = tokens.create(conn, name="sam", role="support")
        _, operator = tokens.create(conn, name="olga", role="operator")
    return Tokens(support=support, operator=operator)


@pytest.fixture
def client(api_settings: Settings, endpoints: None) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings)) as test_client:
        yield test_client


def window(days: int = 1) -> dict[str, str]:
    """A since/until pair around now, as query parameters."""
    now = dt.datetime.now(dt.UTC)
    return {
        "since": (now - dt.timedelta(days=days)).isoformat(),
        "until": (now + dt.timedelta(minutes=5)).isoformat(),
    }
