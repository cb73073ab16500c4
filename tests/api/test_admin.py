"""Administration over the real app: endpoint create/update, secret rotation, recover,
tokens; every change audited with masked values, secrets only to the operator who asked."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.dispatch import retention
from tests.api.builders import add_attempt, add_effect
from tests.api.conftest import Tokens


def _actions(client: TestClient, tokens: Tokens) -> list[dict[str, object]]:
    return list(client.get("/v1/operator-actions", headers=tokens.auth("support")).json())


def test_rotating_a_secret_answers_the_operator_only_and_is_audited(
    client: TestClient, api_tokens: Tokens
) -> None:
    url = "/v1/endpoints/billing-webhook/rotate-secret"
    body = {"reason": "yearly", "overlap_s": 7200}
    assert client.post(url, json=body, headers=api_tokens.auth("support")).status_code == 403
    response = client.post(url, json=body, headers=api_tokens.auth("operator"))
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    secret = response.json()["signing_secret"]
    assert secret.startswith("whsec_") and response.json()["previous_valid_until"]
    (action,) = _actions(client, api_tokens)
    assert (action["action"], action["actor"], action["target"]) == (
        "rotate_secret",
        "olga",
        "billing-webhook",
    )
    assert action["details"] == {"signing_secret": {"old": "***", "new": "***"}, "overlap_s": 7200}
    status = client.get("/v1/status", headers=api_tokens.auth("support")).text
    assert secret not in status and secret not in json.dumps(_actions(client, api_tokens))
    email = client.post(
        "/v1/endpoints/billing-email/rotate-secret", json=body, headers=api_tokens.auth("operator")
    )
    assert email.status_code == 409 and "only webhooks" in email.json()["detail"]


def test_an_update_is_checked_like_add_and_audited_old_to_new(
    client: TestClient, api_tokens: Tokens
) -> None:
    auth = api_tokens.auth("operator")
    url = "/v1/endpoints/billing-webhook"
    bad = client.patch(url, json={"reason": "x", "url": "ftp://nope"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "url"
    body = {
        "reason": "receiver moved, ticket 12",
        "url": "https://new.example.com/hook?token=s3cr3t",
        "rate_limit_per_s": 20,
        "retry_schedule_s": None,
    }
    done = client.patch(url, json=body, headers=auth)
    assert done.status_code == 200, done.text
    assert done.json()["url"] == body["url"] and done.json()["rate_limit_per_s"] == 20
    assert "signing_secret" not in done.text
    (action,) = _actions(client, api_tokens)
    assert action["action"] == "update_endpoint" and action["reason"] == body["reason"]
    assert action["details"] == {
        "changes": {
            "url": {
                "old": "http://127.0.0.1:9/hook",
                "new": "https://new.example.com/hook?token=%2A%2A%2A",
            },
            "rate_limit_per_s": {"old": None, "new": 20.0},
        }
    }
    to_email = {"reason": "x", "url": "https://a.example"}
    email = client.patch("/v1/endpoints/billing-email", json=to_email, headers=auth)
    assert email.status_code == 422
    missing = client.patch("/v1/endpoints/nope", json={"reason": "x", "timeout_s": 3}, headers=auth)
    assert missing.status_code == 404


def test_endpoint_and_token_creation_and_revocation_are_audited(
    client: TestClient, api_tokens: Tokens
) -> None:
    auth = api_tokens.auth("operator")
    hook = client.post(
        "/v1/endpoints",
        json={"reason": "new customer", "name": "crm", "url": "https://crm.example.com/h"},
        headers=auth,
    )
    assert hook.status_code == 200, hook.text
    assert hook.json()["signing_secret"].startswith("whsec_")
    created = client.post(
        "/v1/tokens", json={"reason": "new hire", "name": "tim", "role": "support"}, headers=auth
    )
    assert created.status_code == 200 and created.json()["token"].startswith("obx_")
    tim = {"Authorization": f"Bearer {created.json()['token']}"}
    assert client.get("/v1/status", headers=tim).status_code == 200
    revoked = client.post("/v1/tokens/tim/revoke", json={"reason": "left"}, headers=auth)
    assert revoked.status_code == 200
    assert client.get("/v1/status", headers=tim).status_code == 401
    actions = [(a["action"], a["target"]) for a in _actions(client, api_tokens)]
    assert actions == [("revoke_token", "tim"), ("create_token", "tim"), ("create_endpoint", "crm")]
    assert created.json()["token"] not in json.dumps(_actions(client, api_tokens))


def test_recover_counts_first_then_requeues_what_died_since(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        dead = [add_effect(conn, f"r-{i}") for i in range(4)]
        for effect in dead:
            add_attempt(conn, effect, "dead", status_code=500, error="HTTP 500")
        conn.execute(  # one died long before the outage
            sa.text("UPDATE effects SET updated_at = now() - interval '9 days' WHERE id = :id"),
            {"id": dead[0].id},
        )
    auth = api_tokens.auth("operator")
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)).isoformat()
    url = "/v1/endpoints/billing-webhook/recover"
    body = {"reason": "receiver back up", "since": since}
    assert client.post(url, json=body, headers=auth).json()["matched"] == 3
    capped = client.post(url, json={**body, "dry_run": False, "cap": 2}, headers=auth)
    assert capped.status_code == 409
    done = client.post(url, json={**body, "dry_run": False}, headers=auth).json()
    assert done["requeued"] == 3
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT id, state FROM effects")).all())
    assert [states[e.id] for e in dead] == ["dead", "pending", "pending", "pending"]
    (action,) = _actions(client, api_tokens)
    assert action["action"] == "recover_endpoint" and action["details"]["requeued"] == 3  # type: ignore[index]


def test_a_purged_key_answers_404_with_what_the_ledger_knows(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        effect = add_effect(conn, "old", payload={"card": {"pan": "4111"}})
        add_attempt(conn, effect, "delivered", status_code=200)  # and its ledger row
    retention.purge(engine, retention.cutoff_for(0), batch_size=10)
    response = client.get(f"/v1/effects/{effect.key}", headers=api_tokens.auth("support"))
    assert response.status_code == 404, response.text
    said = response.json()["detail"]
    assert "delivered to billing-webhook" in said and "retention has deleted its record" in said
    client.cookies.set("outbox_session", api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}")
    assert page.status_code == 404 and "retention has deleted" in page.text
    assert "4111" not in page.text


def test_a_token_may_not_take_a_name_the_system_writes_in_the_audit_trail(
    client: TestClient, api_tokens: Tokens
) -> None:
    auth = api_tokens.auth("operator")
    for name in ("system", " System ", "cli:root", "dispatcher:host-1", "UI:olga"):
        body = {"reason": "forge", "name": name, "role": "operator"}
        response = client.post("/v1/tokens", json=body, headers=auth)
        assert response.status_code == 422, name
        (item,) = response.json()["detail"]
        assert item["loc"] == ["body", "name"]
        assert "reserved" in item["msg"] and "e.g. alice" in item["msg"]
    assert [a["action"] for a in _actions(client, api_tokens)] == []
    body = {"reason": "new hire", "name": "systems-team", "role": "support"}
    assert client.post("/v1/tokens", json=body, headers=auth).status_code == 200
