"""Operator actions: each needs a reason, changes state or says why not, and is audited."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from spark_outbox.console import operations
from spark_outbox.core.errors import InvalidRequest
from tests.api.builders import add_attempt, add_effect, story
from tests.api.conftest import Tokens, window


def _state(engine: Engine, key: str) -> tuple[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT state, attempt_count FROM effects WHERE idempotency_key = :k"),
            {"k": key},
        ).one()
    return row[0], row[1]


def _actions(client: TestClient, tokens: Tokens) -> list[dict[str, object]]:
    response = client.get("/v1/operator-actions", headers=tokens.auth("support"))
    assert response.status_code == 200
    return list(response.json())


def test_requeue_makes_a_dead_effect_pending_and_is_audited(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"]
    response = client.post(
        f"/v1/effects/{dead.key}/requeue",
        json={"reason": "receiver fixed, ticket 4711"},
        headers=api_tokens.auth("operator"),
    )
    assert response.status_code == 200, response.text
    assert _state(engine, dead.key) == ("pending", 1)  # attempts kept
    (action,) = _actions(client, api_tokens)
    assert (action["actor"], action["action"], action["target"]) == ("olga", "requeue", dead.key)
    assert action["reason"] == "receiver fixed, ticket 4711"


def test_requeue_of_a_delivered_effect_is_409_and_leaves_no_record(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    delivered = story(engine)["delivered"]
    response = client.post(
        f"/v1/effects/{delivered.key}/requeue",
        json={"reason": "try"},
        headers=api_tokens.auth("operator"),
    )
    assert response.status_code == 409
    assert "delivered" in response.json()["detail"]
    assert _state(engine, delivered.key)[0] == "delivered"
    assert _actions(client, api_tokens) == []


def test_cancel_only_applies_to_pending_effects(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    pending = story(engine)["pending"]
    url = f"/v1/effects/{pending.key}/cancel"
    first = client.post(url, json={"reason": "customer left"}, headers=api_tokens.auth("operator"))
    assert first.status_code == 200
    assert _state(engine, pending.key)[0] == "cancelled"
    again = client.post(url, json={"reason": "again"}, headers=api_tokens.auth("operator"))
    assert again.status_code == 409
    missing = client.post(
        f"/v1/effects/{'b' * 64}/cancel", json={"reason": "x"}, headers=api_tokens.auth("operator")
    )
    assert missing.status_code == 404


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": "a\x00b"}])
def test_a_reason_is_required(
    client: TestClient, api_tokens: Tokens, engine: Engine, body: dict[str, str]
) -> None:
    dead = story(engine)["dead"]
    response = client.post(
        f"/v1/effects/{dead.key}/requeue", json=body, headers=api_tokens.auth("operator")
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-1] == "reason"
    assert _state(engine, dead.key)[0] == "dead"


def test_pause_and_resume_an_endpoint(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    auth = api_tokens.auth("operator")
    paused = client.post(
        "/v1/endpoints/billing-webhook/pause", json={"reason": "receiver down"}, headers=auth
    )
    assert paused.status_code == 200
    status = client.get("/v1/status", headers=auth).json()
    hook = next(e for e in status["endpoints"] if e["name"] == "billing-webhook")
    assert hook["enabled"] is False and hook["paused_reason"] == "receiver down"
    resumed = client.post(
        "/v1/endpoints/billing-webhook/resume", json={"reason": "back up"}, headers=auth
    )
    assert resumed.status_code == 200
    assert [a["action"] for a in _actions(client, api_tokens)] == [
        "resume_endpoint",
        "pause_endpoint",
    ]
    unknown = client.post("/v1/endpoints/nope/pause", json={"reason": "x"}, headers=auth)
    assert unknown.status_code == 404


def test_bulk_requeue_counts_first_then_respects_its_cap(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        dead = [add_effect(conn, f"d-{i}", recipient="erin@example.com") for i in range(3)]
        for effect in dead:
            add_attempt(conn, effect, "dead", status_code=400, error="HTTP 400")
    auth = api_tokens.auth("operator")
    body = {"reason": "bulk fix", "recipient": "erin@example.com", **window()}
    dry = client.post("/v1/effects/bulk-requeue", json=body, headers=auth).json()
    assert dry == {"matched": 3, "requeued": 0, "dry_run": True, "cap": 1000}
    assert {_state(engine, e.key)[0] for e in dead} == {"dead"}
    capped = client.post(
        "/v1/effects/bulk-requeue", json={**body, "dry_run": False, "cap": 2}, headers=auth
    )
    assert capped.status_code == 409
    assert {_state(engine, e.key)[0] for e in dead} == {"dead"}
    done = client.post("/v1/effects/bulk-requeue", json={**body, "dry_run": False}, headers=auth)
    assert done.json()["requeued"] == 3
    assert {_state(engine, e.key)[0] for e in dead} == {"pending"}
    (action,) = _actions(client, api_tokens)
    assert action["action"] == "bulk_requeue" and action["details"]["requeued"] == 3  # type: ignore[index]


def test_operator_actions_are_append_only(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"]
    client.post(
        f"/v1/effects/{dead.key}/requeue", json={"reason": "r"}, headers=api_tokens.auth("operator")
    )
    for statement in (
        "UPDATE operator_actions SET reason = 'forged'",
        "DELETE FROM operator_actions",
    ):
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text(statement))
    assert _actions(client, api_tokens)[0]["reason"] == "r"


def test_the_store_refuses_a_nul_in_a_reason_whoever_calls_it(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="reason"), engine.begin() as conn:
        operations.cancel(conn, "0" * 64, actor="olga", reason="a\x00b")
