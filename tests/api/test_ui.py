"""The support page over TestClient: sign-in cookie, escaping, CSRF, operator-only buttons."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from dispatcher import tokens
from tests.api.builders import add_effect, story
from tests.api.conftest import Tokens


def _sign_in(client: TestClient, token: str) -> None:
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_the_page_asks_for_a_token_first(client: TestClient) -> None:
    response = client.get("/ui")
    assert response.status_code == 401 and "Sign in" in response.text
    bad = client.post("/ui/login", data={"token": "obx_wrong"})
    assert bad.status_code == 401 and "unknown or revoked" in bad.text


def test_values_are_escaped(client: TestClient, api_tokens: Tokens, engine: Engine) -> None:
    with engine.begin() as conn:
        effect = add_effect(conn, "xss", recipient="<script>alert(1)</script>")
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_buttons_are_for_operators_and_need_the_csrf_token(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"]
    _sign_in(client, api_tokens.support)
    assert "Requeue" not in client.get(f"/ui/effects/{dead.key}").text
    _sign_in(client, api_tokens.operator)
    assert "Requeue" in client.get(f"/ui/effects/{dead.key}").text
    url = f"/ui/effects/{dead.key}/requeue"
    forged = client.post(url, data={"reason": "x", "csrf": "0" * 64}, follow_redirects=False)
    assert forged.status_code == 403
    csrf = tokens.csrf_token(api_tokens.operator)
    done = client.post(url, data={"reason": "fixed", "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303
    with engine.connect() as conn:
        state = conn.execute(
            sa.text("SELECT state FROM effects WHERE idempotency_key = :k"), {"k": dead.key}
        ).scalar_one()
        actor = conn.execute(sa.text("SELECT actor FROM operator_actions")).scalar_one()
    assert state == "pending" and actor == "olga"


def test_search_box_takes_a_key_a_recipient_or_a_batch(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    _sign_in(client, api_tokens.support)
    by_key = client.get("/ui/search", params={"q": built["dead"].key}, follow_redirects=False)
    assert by_key.headers["location"] == f"/ui/effects/{built['dead'].key}"
    by_recipient = client.get("/ui/search", params={"q": "bob@example.com"}).text
    assert built["dead"].key[:16] in by_recipient and built["pending"].key[:16] in by_recipient
    by_batch = client.get("/ui/search", params={"q": "billing/2026-11-21"})
    assert "Batch billing / 2026-11-21" in by_batch.text
    assert built["batch1"].key[:16] in by_batch.text
    assert str(by_batch.url).endswith("/ui/batch?job=billing&batch_id=2026-11-21")
    missing = client.get("/ui/search", params={"q": "billing/nope"})
    assert missing.status_code == 200
    assert "No committed batch, reference or recipient" in missing.text
