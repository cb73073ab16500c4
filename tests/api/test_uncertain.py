"""Uncertain effects over the API: listed for both roles (masked for support),
resolved by operators only, with a dry run, a reason, a 409 race and an audit row."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.console import tokens
from tests.api.builders import Built, add_effect
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in

PAN = "4111111111111111"


def _uncertain(engine: Engine, name: str, endpoint: str = "billing-email") -> Built:
    """An effect whose send started and whose lease expired (as settle_uncertain leaves it)."""
    with engine.begin() as conn:
        built = add_effect(
            conn,
            name,
            endpoint=endpoint,
            payload={"subject": "s", "text": "t", "card": {"pan": PAN}},
        )
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'uncertain', send_started_at = now(),"
                " attempt_count = 1, last_error = :error WHERE id = :id"
            ),
            {"id": built.id, "error": f"handed over, then no answer (receiver said {PAN})"},
        )
    return built


def _row(engine: Engine, key: str) -> tuple[str, object, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT e.state, e.send_started_at,"
                " (SELECT count(*) FROM key_ledger k WHERE k.idempotency_key = e.idempotency_key)"
                " FROM effects e WHERE idempotency_key = :k"
            ),
            {"k": key},
        ).one()
    return row[0], row[1], int(row[2])


def _actions(engine: Engine) -> list[tuple[str, str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT actor, action, target, reason FROM operator_actions ORDER BY id")
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def test_support_sees_uncertain_effects_masked_and_cannot_resolve_them(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = _uncertain(engine, "a")
    listed = client.get("/v1/uncertain-effects", headers=api_tokens.auth("support"))
    assert listed.status_code == 200
    (item,) = listed.json()
    assert item["idempotency_key"] == effect.key and item["send_started_at"]
    assert PAN not in item["last_error"] and "***" in item["last_error"]
    as_operator = client.get("/v1/uncertain-effects", headers=api_tokens.auth("operator"))
    assert PAN in as_operator.json()[0]["last_error"]
    status = client.get("/v1/status", headers=api_tokens.auth("support")).json()
    assert status["counts"]["uncertain"] == 1
    refused = client.post(
        f"/v1/effects/{effect.key}/resolve",
        json={"action": "send_again", "reason": "support tries"},
        headers=api_tokens.auth("support"),
    )
    assert refused.status_code == 403
    assert _row(engine, effect.key)[0] == "uncertain" and _actions(engine) == []


def test_a_dry_run_changes_nothing_then_mark_delivered_writes_the_ledger_and_the_audit(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = _uncertain(engine, "b")
    url = f"/v1/effects/{effect.key}/resolve"
    body = {"action": "mark_delivered", "reason": "customer confirmed, ticket 12"}
    trial = client.post(url, json=body | {"dry_run": True}, headers=api_tokens.auth("operator"))
    assert trial.status_code == 200 and trial.json()["dry_run"] is True
    assert _row(engine, effect.key)[0] == "uncertain" and _actions(engine) == []
    done = client.post(url, json=body, headers=api_tokens.auth("operator"))
    assert done.status_code == 200, done.text
    assert done.json() == {
        "action": "mark_delivered",
        "target": effect.key,
        "effects": 1,
        "dry_run": False,
    }
    assert _row(engine, effect.key) == ("delivered", None, 1)
    assert _actions(engine) == [("olga", "mark_delivered", effect.key, body["reason"])]
    # The race: a second resolve finds it no longer uncertain.
    late = client.post(
        url, json={"action": "send_again", "reason": "x"}, headers=api_tokens.auth("operator")
    )
    assert late.status_code == 409 and "is delivered" in late.json()["detail"]
    assert len(_actions(engine)) == 1


def test_send_again_makes_it_pending_due_now_with_its_start_cleared(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = _uncertain(engine, "c")
    done = client.post(
        f"/v1/effects/{effect.key}/resolve",
        json={"action": "send_again", "reason": "customer has no mail"},
        headers=api_tokens.auth("operator"),
    )
    assert done.status_code == 200, done.text
    assert _row(engine, effect.key) == ("pending", None, 0)
    with engine.connect() as conn:
        claimable = conn.execute(
            sa.text("SELECT count(*) FROM due_effects WHERE idempotency_key = :k"),
            {"k": effect.key},
        ).scalar_one()
    assert claimable == 1


@pytest.mark.parametrize(
    "body",
    [
        {"action": "send_again"},
        {"action": "send_again", "reason": ""},
        {"action": "resend", "reason": "x"},
        {"reason": "x"},
    ],
)
def test_a_reason_and_a_known_action_are_required(
    client: TestClient, api_tokens: Tokens, engine: Engine, body: dict[str, str]
) -> None:
    effect = _uncertain(engine, "d")
    response = client.post(
        f"/v1/effects/{effect.key}/resolve", json=body, headers=api_tokens.auth("operator")
    )
    assert response.status_code == 422
    assert _row(engine, effect.key)[0] == "uncertain"


def test_resolving_a_pending_or_unknown_effect_is_refused(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        pending = add_effect(conn, "e")
    body = {"action": "mark_delivered", "reason": "x"}
    op = api_tokens.auth("operator")
    assert (
        client.post(f"/v1/effects/{pending.key}/resolve", json=body, headers=op).status_code == 409
    )
    assert client.post(f"/v1/effects/{'c' * 64}/resolve", json=body, headers=op).status_code == 404
    assert _row(engine, pending.key)[0] == "pending"


def test_bulk_resolve_by_endpoint_counts_first_then_resolves_within_the_cap(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    keys = [_uncertain(engine, f"bulk-{i}").key for i in range(3)]
    other = _uncertain(engine, "hook", endpoint="billing-webhook").key
    url = "/v1/endpoints/billing-email/resolve-uncertain"
    op = api_tokens.auth("operator")
    counted = client.post(url, json={"action": "send_again", "reason": "outage"}, headers=op)
    assert counted.status_code == 200 and counted.json()["effects"] == 3
    assert counted.json()["dry_run"] is True and _actions(engine) == []
    over = client.post(
        url, json={"action": "send_again", "reason": "x", "dry_run": False, "cap": 2}, headers=op
    )
    assert over.status_code == 409
    done = client.post(
        url, json={"action": "send_again", "reason": "outage", "dry_run": False}, headers=op
    )
    assert done.status_code == 200 and done.json()["effects"] == 3
    assert {_row(engine, k)[0] for k in keys} == {"pending"}
    assert _row(engine, other)[0] == "uncertain"
    assert _actions(engine) == [("olga", "send_again_endpoint", "billing-email", "outage")]


def test_the_support_page_lists_uncertain_effects_masked_and_only_operators_resolve(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = _uncertain(engine, "ui")
    _sign_in(client, api_tokens.support)
    home = client.get("/ui").text
    assert 'id="uncertain-line"' in home and "/ui/uncertain" in home
    page = client.get("/ui/uncertain").text
    assert effect.key[:16] in page and PAN not in page and "***" in page
    detail = client.get(f"/ui/effects/{effect.key}").text
    assert 'id="uncertain-note"' in detail and "Send again" not in detail
    url = f"/ui/effects/{effect.key}/send_again"
    csrf = tokens.csrf_token(api_tokens.support)
    refused = client.post(url, data={"reason": "x", "csrf": csrf}, follow_redirects=False)
    assert refused.status_code == 403
    _sign_in(client, api_tokens.operator)
    assert PAN in client.get("/ui/uncertain").text
    assert "Send again" in client.get(f"/ui/effects/{effect.key}").text
    csrf = tokens.csrf_token(api_tokens.operator)
    done = client.post(url, data={"reason": "no mail", "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303
    assert _row(engine, effect.key)[0] == "pending"
    assert 'id="no-uncertain"' in client.get("/ui/uncertain").text


def test_deduplicates_defaults_by_kind_and_is_changed_with_an_audited_diff(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.connect() as conn:  # inserted by raw SQL without the column: the trigger
        kinds = dict(conn.execute(sa.text("SELECT name, deduplicates FROM endpoints")).all())
    assert kinds == {"billing-webhook": True, "billing-email": False}
    op = api_tokens.auth("operator")
    created = client.post(
        "/v1/endpoints",
        json={
            "name": "crm",
            "url": "https://crm.example.com/hooks",
            "deduplicates": False,
            "reason": "CRM ignores webhook-id",
        },
        headers=op,
    )
    assert created.status_code == 200, created.text
    assert created.json()["endpoint"]["deduplicates"] is False
    changed = client.patch(
        "/v1/endpoints/crm", json={"deduplicates": True, "reason": "CRM fixed"}, headers=op
    )
    assert changed.status_code == 200 and changed.json()["deduplicates"] is True
    kept = client.patch(
        "/v1/endpoints/crm", json={"deduplicates": None, "timeout_s": 5, "reason": "x"}, headers=op
    )
    assert kept.json()["deduplicates"] is True  # null: unchanged
    with engine.connect() as conn:
        details = conn.execute(
            sa.text(
                "SELECT details FROM operator_actions WHERE action = 'update_endpoint'"
                " ORDER BY id LIMIT 1"
            )
        ).scalar_one()
    assert details["changes"] == {"deduplicates": {"old": False, "new": True}}
