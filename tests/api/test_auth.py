"""Tokens, roles and the open health endpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.cli.tools import scratch
from spark_outbox.console import tokens
from spark_outbox.core import db, revisions
from spark_outbox.core.errors import Conflict, InvalidRequest
from spark_outbox.core.settings import Settings
from tests.api.conftest import Tokens


def test_health_endpoints_are_open(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


@pytest.fixture
def unmigrated_url(server_url: str) -> Iterator[str]:
    url = scratch.create_empty_database(server_url)
    yield url
    scratch.drop_database(server_url, scratch.database_name(url))


def test_the_app_refuses_to_start_on_a_database_never_migrated(
    api_settings: Settings, unmigrated_url: str
) -> None:
    app = create_app(dataclasses.replace(api_settings, database_url=unmigrated_url))
    with pytest.raises(revisions.SchemaBehind, match="no outbox schema") as refused:
        TestClient(app).__enter__()
    assert revisions.head() in str(refused.value) and "outbox db upgrade" in str(refused.value)


def test_readyz_is_503_when_the_schema_falls_behind_a_running_app(
    client: TestClient, api_settings: Settings, engine: Engine
) -> None:
    assert client.get("/readyz").status_code == 200
    db.downgrade(api_settings.database_url, "outbox@-1")
    previous = revisions.read(engine).current
    assert previous is not None and previous != revisions.head()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "schema not at head",
        "current": previous,
        "head": revisions.head(),
    }


def test_readyz_is_ready_on_a_later_releases_schema(client: TestClient, engine: Engine) -> None:
    """Migrations are expand-only: the schema of a release after this one (a revision
    this code does not know) leaves this API working, so it stays in the balancer."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE alembic_version SET version_num = '9999later' WHERE version_num = :h"),
            {"h": revisions.head()},
        )
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "revision": "9999later"}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer obx_not-a-real-token"}, {"Authorization": "Basic b2JveDp4"}],
)
def test_missing_or_unknown_token_is_401(
    client: TestClient, api_tokens: Tokens, headers: dict[str, str]
) -> None:
    response = client.get("/v1/status", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


def test_revoked_token_is_401(client: TestClient, api_tokens: Tokens, engine: Engine) -> None:
    assert client.get("/v1/status", headers=api_tokens.auth("support")).status_code == 200
    with engine.begin() as conn:
        tokens.revoke(conn, "sam")
    assert client.get("/v1/status", headers=api_tokens.auth("support")).status_code == 401


def test_support_role_may_read_but_not_write(client: TestClient, api_tokens: Tokens) -> None:
    key = "0" * 64
    response = client.post(
        f"/v1/effects/{key}/requeue", json={"reason": "x"}, headers=api_tokens.auth("support")
    )
    assert response.status_code == 403
    assert "operator" in response.json()["detail"]


def test_only_the_token_hash_is_stored(engine: Engine) -> None:
    with engine.begin() as conn:
        created, plaintext = tokens.create(conn, name="ci", role="operator")
        stored = conn.execute(sa.text("SELECT * FROM api_tokens")).mappings().one()
    assert plaintext.startswith("obx_") and len(plaintext) > 40 and created.role == "operator"
    assert plaintext not in {str(v) for v in stored.values()}
    assert stored["token_sha256"] == tokens.token_sha256(plaintext)
    with engine.begin() as conn:
        assert tokens.authenticate(conn, plaintext).name == "ci"


def test_token_creation_checks_role_and_name(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="role"), engine.begin() as conn:
        tokens.create(conn, name="x", role="admin")
    with engine.begin() as conn:
        tokens.create(conn, name="x", role="support")
    with pytest.raises(Conflict), engine.begin() as conn:
        tokens.create(conn, name="x", role="support")


def test_secrets_are_never_returned(client: TestClient, api_tokens: Tokens) -> None:
    body = client.get("/v1/status", headers=api_tokens.auth("operator")).text
    assert "billing-email" in body
    assert "hunter2-smtp" not in body and "whsec_" not in body
    # A secret has a field only in the answers to the operator who creates or rotates
    # it (once, Cache-Control: no-store); no read route's schema can carry one.
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    with_secret = {n for n, s in schemas.items() if "signing_secret" in s.get("properties", {})}
    assert with_secret == {"EndpointSecretPublic", "RotationPublic"}
    paths = client.get("/openapi.json").json()["paths"]
    for path, ops in paths.items():
        for method, op in ops.items():
            answer = str(op.get("responses", {}).get("200", {}))
            if any(name in answer for name in with_secret):
                assert method == "post" and path.startswith("/v1/endpoints"), path
