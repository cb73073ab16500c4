"""The endpoint lifecycle over the real app: every setting of an e-mail endpoint
changed by PATCH (the password never shown again, audited "(changed)"), archive and
unarchive by an operator only, an archived endpoint's history still found by the API
and the support page."""

from __future__ import annotations

import json

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core import endpoints
from tests.api.builders import add_attempt, add_effect
from tests.api.conftest import Tokens, window
from tests.api.test_ui import _sign_in


def _actions(client: TestClient, tokens: Tokens) -> list[dict[str, object]]:
    return list(client.get("/v1/operator-actions", headers=tokens.auth("support")).json())


def test_every_smtp_setting_is_updated_by_patch_and_the_password_is_never_shown(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    url, auth = "/v1/endpoints/billing-email", api_tokens.auth("operator")
    body = {
        "reason": "new relay, ticket 31",
        "smtp_host": "relay.example.com",
        "smtp_port": 465,
        "smtp_tls": "tls",
        "smtp_username": "billing",
        "smtp_password": "n3w-relay-pw",
        "mail_from": "invoices@example.com",
    }
    assert client.patch(url, json=body, headers=api_tokens.auth("support")).status_code == 403
    done = client.patch(url, json=body, headers=auth)
    assert done.status_code == 200, done.text
    shown = done.json()
    assert (shown["smtp_host"], shown["smtp_port"], shown["smtp_tls"]) == (
        "relay.example.com",
        465,
        "tls",
    )
    assert shown["has_smtp_password"] is True and "n3w-relay-pw" not in done.text
    with engine.connect() as conn:
        assert endpoints.get(conn, "billing-email").smtp_password == "n3w-relay-pw"
    (action,) = _actions(client, api_tokens)
    changes = action["details"]["changes"]  # type: ignore[index]
    assert changes["smtp_password"] == {"old": "***", "new": "(changed)"}
    assert changes["smtp_tls"] == {"old": "none", "new": "tls"}
    assert changes["mail_from"]["new"] == "invoices@example.com"
    assert "n3w-relay-pw" not in json.dumps(_actions(client, api_tokens))
    status = client.get("/v1/status", headers=api_tokens.auth("operator")).text
    assert "n3w-relay-pw" not in status


def test_smtp_settings_are_checked_together_and_refused_on_a_webhook(
    client: TestClient, api_tokens: Tokens
) -> None:
    auth = api_tokens.auth("operator")
    plain = {"reason": "r", "smtp_tls": "none", "smtp_username": "billing"}
    refused = client.patch("/v1/endpoints/billing-email", json=plain, headers=auth)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "smtp_tls"
    assert "smtp_allow_plaintext_auth=true" in refused.json()["detail"][0]["msg"]
    hook = client.patch(
        "/v1/endpoints/billing-webhook", json={"reason": "r", "smtp_port": 25}, headers=auth
    )
    assert hook.status_code == 422 and hook.json()["detail"][0]["loc"][-1] == "smtp_port"
    bad_port = client.patch(
        "/v1/endpoints/billing-email", json={"reason": "r", "smtp_port": 0}, headers=auth
    )
    assert bad_port.status_code == 422
    assert _actions(client, api_tokens) == []


def test_an_archived_endpoints_history_stays_searchable_and_unarchive_brings_it_back(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        old = add_effect(conn, "old", endpoint="billing-webhook")
        add_attempt(conn, old, "delivered", status_code=200)
        pending = add_effect(conn, "pending", endpoint="billing-webhook")
    url, auth = "/v1/endpoints/billing-webhook", api_tokens.auth("operator")
    body = {"reason": "receiver retired"}
    assert (
        client.post(f"{url}/archive", json=body, headers=api_tokens.auth("support")).status_code
        == 403
    )
    refused = client.post(f"{url}/archive", json=body, headers=auth)
    assert refused.status_code == 409 and "cancel_pending" in refused.json()["detail"]
    done = client.post(f"{url}/archive", json=body | {"cancel_pending": True}, headers=auth)
    assert done.status_code == 200 and done.json() == {
        "endpoint": "billing-webhook",
        "cancelled": 1,
    }
    support = api_tokens.auth("support")
    params = window() | {"endpoint": "billing-webhook"}
    found = client.get("/v1/effects", params=params, headers=support).json()["items"]
    assert {e["idempotency_key"]: e["state"] for e in found} == {
        old.key: "delivered",
        pending.key: "cancelled",
    }
    status = client.get("/v1/status", headers=support)
    assert status.status_code == 200
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{old.key}")
    assert page.status_code == 200 and "billing-webhook" in page.text
    back = client.post(f"{url}/unarchive", json={"reason": "back"}, headers=auth)
    assert back.status_code == 200 and back.json()["archived_at"] is None
    assert back.json()["enabled"] is True
    actions = [(a["action"], a["target"]) for a in _actions(client, api_tokens)]
    assert actions == [
        ("unarchive_endpoint", "billing-webhook"),
        ("archive_endpoint", "billing-webhook"),
    ]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM effects")).scalar() == 2
