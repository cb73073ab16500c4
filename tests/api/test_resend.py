"""Resend over the API and the support page: operators only, a reason, a dry run,
refusals that say why (never an erased or purged payload, never an archived
endpoint), bulk by batch with a cap; support sees the resend, not the button."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.dispatch import retention
from tests.api.builders import Built, add_attempt, add_batch, add_effect
from tests.api.conftest import Tokens, window
from tests.api.test_ui import _sign_in


def _delivered(engine: Engine, name: str, **kw: Any) -> Built:
    with engine.begin() as conn:
        effect = add_effect(conn, name, **kw)
        add_attempt(conn, effect, "delivered", status_code=200)
    return effect


def _row(engine: Engine, key: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT state, resend_action_id FROM effects WHERE idempotency_key = :k"),
            {"k": key},
        ).one()


def _actions(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT id, actor, action, target, reason, details FROM operator_actions")
        ).all()


def test_an_operator_resends_a_delivered_effect_with_a_reason_after_a_dry_run(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    key = _delivered(engine, "inv-1").key
    body = {"reason": "customer restored a backup, ticket 4711"}
    operator = api_tokens.auth("operator")
    refused = client.post(
        f"/v1/effects/{key}/resend", json=body, headers=api_tokens.auth("support")
    )
    assert refused.status_code == 403
    dry = client.post(f"/v1/effects/{key}/resend", json=body | {"dry_run": True}, headers=operator)
    assert dry.status_code == 200 and dry.json()["matched"] == 1 and dry.json()["resent"] == 0
    assert _row(engine, key) == ("delivered", None) and _actions(engine) == []

    done = client.post(f"/v1/effects/{key}/resend", json=body, headers=operator).json()
    (action,) = _actions(engine)
    assert done["resent"] == 1 and done["action_id"] == action.id
    assert (action.actor, action.action, action.target) == ("olga", "resend", key)
    assert action.details == {"endpoint": "billing-webhook", "was": "delivered"}
    assert _row(engine, key) == ("pending", action.id)
    # Support sees who asked for it and why on the effect.
    detail = client.get(f"/v1/effects/{key}", headers=api_tokens.auth("support")).json()
    assert detail["resend"]["actor"] == "olga" and "ticket 4711" in detail["resend"]["reason"]
    assert detail["effect"]["resend_action_id"] == action.id
    # Pending now: a second resend is refused, saying why.
    again = client.post(f"/v1/effects/{key}/resend", json=body, headers=operator)
    assert again.status_code == 409 and "waiting to be sent already" in again.json()["detail"]


def test_a_resend_is_refused_with_its_reason_for_every_effect_it_must_not_send(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    operator = api_tokens.auth("operator")
    purged = _delivered(engine, "old-one").key
    retention.purge(engine, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1), batch_size=100)
    erased = _delivered(engine, "erased-one", recipient="ann@example.com").key
    erase = {"reason": "GDPR request 17", "recipient": "ann@example.com", "dry_run": False}
    assert client.post("/v1/erase", json=erase, headers=operator).status_code == 200
    with engine.begin() as conn:
        pending = add_effect(conn, "waiting").key
        uncertain = add_effect(conn, "unknown").key
        conn.execute(
            sa.text("UPDATE effects SET state = 'uncertain' WHERE idempotency_key = :k"),
            {"k": uncertain},
        )
    mail = {"subject": "Your invoice", "text": "Hi"}
    archived = _delivered(engine, "on-email", endpoint="billing-email", payload=mail).key
    unregistered = "ab" * 32
    with engine.begin() as conn:  # a Spark row naming an endpoint nobody registered
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, state)"
                " VALUES (:k, 'nowhere', '{}', 'x', 'dead')"
            ),
            {"k": unregistered},
        )
    archive = {"reason": "retired"}
    assert client.post(
        "/v1/endpoints/billing-email/archive", json=archive, headers=operator
    ).is_success

    body = {"reason": "customer asked"}
    expected = {
        purged: (404, "its record is gone: nothing to resend"),  # retention deleted it
        erased: (409, "never sent again"),
        pending: (409, "waiting to be sent already"),
        uncertain: (409, "outbox effects resolve"),
        archived: (409, "outbox endpoints unarchive billing-email"),
        unregistered: (409, "'nowhere' is not registered"),
        "0" * 64: (404, "no effect"),
    }
    for key, (status, words) in expected.items():
        response = client.post(f"/v1/effects/{key}/resend", json=body, headers=operator)
        assert (response.status_code, words in response.json()["detail"]) == (status, True), key
    assert [a.action for a in _actions(engine)] == ["erase", "erased", "archive_endpoint"]
    blank = client.post(f"/v1/effects/{purged}/resend", json={"reason": " "}, headers=operator)
    assert blank.status_code == 422 and blank.json()["detail"][0]["loc"][-1] == "reason"


def test_a_bulk_resend_of_a_batch_counts_first_keeps_its_cap_and_says_what_it_refused(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    operator = api_tokens.auth("operator")
    with engine.begin() as conn:
        rows = [{"name": f"r-{i}"} for i in range(5)]
        built = add_batch(conn, "billing", "2026-11-26", rows)
        for effect in built[:4]:
            add_attempt(conn, effect, "delivered", status_code=200)
        add_attempt(conn, built[4], "dead", status_code=400, error="HTTP 400")
    with engine.begin() as conn:  # the first finished two days ago: past retention's horizon
        conn.execute(
            sa.text("UPDATE effects SET updated_at = now() - interval '2 days' WHERE id = :id"),
            {"id": built[0].id},
        )
    retention.purge(engine, dt.datetime.now(dt.UTC) - dt.timedelta(days=1), batch_size=100)
    purged = {built[0].key}
    batch = {"job": "billing", "batch_id": "2026-11-26", "reason": "receiver lost the day"}

    dry = client.post("/v1/effects/bulk-resend", json=batch, headers=operator).json()
    assert dry["dry_run"] is True and dry["matched"] == 5 - len(purged)
    assert dry["refused"] == {}  # retention deleted it: not there to match (the ledger knows it)
    over = client.post(
        "/v1/effects/bulk-resend", json=batch | {"cap": 2, "dry_run": False}, headers=operator
    )
    assert over.status_code == 409 and "more than 2" in over.json()["detail"]
    assert [a for a in _actions(engine) if a.action == "bulk_resend"] == []

    done = client.post(
        "/v1/effects/bulk-resend", json=batch | {"dry_run": False}, headers=operator
    ).json()
    assert done["resent"] == 5 - len(purged) and done["refused"] == {}
    (action,) = [a for a in _actions(engine) if a.action == "bulk_resend"]
    assert set(action.details["keys"]) == {b.key for b in built} - purged
    assert action.details["filter"] == {"job": "billing", "batch_id": "2026-11-26"}
    states = _rows(engine, "SELECT state, resend_action_id FROM effects WHERE purged_at IS NULL")
    assert set(states) == {("pending", action.id)}
    # An endpoint's effects are a broad selection: it needs a window, at most 31 days.
    by_endpoint = {"endpoint": "billing-webhook", "reason": "x"}
    assert (
        client.post("/v1/effects/bulk-resend", json=by_endpoint, headers=operator).status_code
        == 422
    )
    windowed = by_endpoint | window() | {"state": "delivered"}
    response = client.post("/v1/effects/bulk-resend", json=windowed, headers=operator)
    assert response.status_code == 200 and response.json()["matched"] == 0  # all pending now


def _rows(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def test_the_support_page_shows_a_resend_and_only_operators_get_its_button(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    key = _delivered(engine, "inv-7").key
    _sign_in(client, api_tokens.support)
    assert 'id="resend-form"' not in client.get(f"/ui/effects/{key}").text
    _sign_in(client, api_tokens.operator)
    page = client.get(f"/ui/effects/{key}").text
    assert 'id="resend-form"' in page
    csrf = page.split('name="csrf" value="', 2)[2].split('"', 1)[0]
    posted = client.post(
        f"/ui/effects/{key}/resend",
        data={"reason": "customer asked, ticket 9", "csrf": csrf},
        follow_redirects=True,
    )
    assert posted.status_code == 200
    assert 'id="effect-resend"' in posted.text and "ticket 9" in posted.text
    assert "waiting to be sent, same key" in posted.text
    _, action_id = _row(engine, key)
    with engine.begin() as conn:  # what the dispatcher records for the resend's send
        conn.execute(
            sa.text(
                "INSERT INTO delivery_attempts (effect_id, attempt, worker_id, started_at,"
                " duration_ms, outcome, status_code, resend_action_id)"
                " SELECT id, 2, 'w', now(), 5, 'delivered', 200, :a FROM effects"
                " WHERE idempotency_key = :k"
            ),
            {"a": action_id, "k": key},
        )
    _sign_in(client, api_tokens.support)
    shown = client.get(f"/ui/effects/{key}").text
    assert f"resend by olga (operator action {action_id})" in shown
    assert 'id="resend-form"' not in shown
