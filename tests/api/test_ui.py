"""The support page over TestClient: sign-in cookie, escaping, CSRF, operator-only buttons."""

from __future__ import annotations

import dataclasses
import logging
import re

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.console import tokens
from spark_outbox.core.settings import Settings
from tests.api.builders import PAN, add_effect, leaky, story
from tests.api.conftest import Tokens

SESSION = "outbox_session"


def _form_csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', page)
    assert found is not None, page
    return found.group(1)


def _sign_in(client: TestClient, token: str) -> httpx.Response:
    """As a browser does: fetch the form (its token and cookie), post it back."""
    csrf = _form_csrf(client.get("/ui/login").text)
    response = client.post("/ui/login", data={"token": token, "csrf": csrf}, follow_redirects=False)
    assert response.status_code == 303, response.text
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    return response


def test_the_page_asks_for_a_token_first(client: TestClient) -> None:
    response = client.get("/ui")
    assert response.status_code == 401 and "Sign in" in response.text
    csrf = _form_csrf(response.text)
    bad = client.post("/ui/login", data={"token": "obx_wrong", "csrf": csrf})
    assert bad.status_code == 401 and "unknown or revoked" in bad.text


def test_the_session_cookie_is_secure_unless_plain_http_is_opted_into(
    api_settings: Settings, endpoints: None, api_tokens: Tokens
) -> None:
    """Secure by default, even when the request itself came over plain HTTP (a TLS
    proxy in front); only OUTBOX_UI_INSECURE_COOKIE=1 drops the flag."""
    for insecure in (False, True):
        settings = dataclasses.replace(api_settings, ui_insecure_cookie=insecure)
        with TestClient(create_app(settings), base_url="http://testserver") as plain:
            form = plain.get("/ui/login")
            assert ("secure" in form.headers["set-cookie"].lower()) is not insecure
            assert ("OUTBOX_UI_INSECURE_COOKIE=1" in form.text) is not insecure  # the hint
            session = plain.post(
                "/ui/login",
                data={"token": api_tokens.support, "csrf": _form_csrf(form.text)},
                headers={"Cookie": form.headers["set-cookie"].split(";")[0]},
                follow_redirects=False,
            )
            assert session.status_code == 303
            (cookie,) = [c for c in session.headers.get_list("set-cookie") if SESSION in c]
            assert ("secure" in cookie.lower()) is not insecure
    assert Settings.from_env({"OUTBOX_UI_INSECURE_COOKIE": "1"}).ui_insecure_cookie
    assert not Settings.from_env({}).ui_insecure_cookie


def test_every_ui_response_forbids_scripts_framing_caching_and_referrers(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"]
    responses = [client.get("/ui"), client.get("/ui/login")]  # 401 and 200 sign-in forms
    responses.append(_sign_in(client, api_tokens.support))  # the redirect
    responses += [
        client.get("/ui"),
        client.get(f"/ui/effects/{dead.key}"),
        client.get("/ui/search", params={"q": "billing/nope"}),  # a 404 page
    ]
    for response in responses:
        headers = response.headers
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp, response.url
        assert "frame-ancestors 'none'" in csp and "form-action 'self'" in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"
        assert headers["referrer-policy"] == "no-referrer"


def test_a_sign_in_without_the_forms_token_is_refused(
    client: TestClient, api_tokens: Tokens
) -> None:
    """Login CSRF: a page elsewhere posting its own token into this browser fails, since
    it can neither read nor set the pre-session cookie the form's token must equal."""
    forged = [
        {"token": api_tokens.support},  # no token at all
        {"token": api_tokens.support, "csrf": "guessed"},  # no cookie to match
    ]
    for data in forged:
        client.cookies.clear()
        response = client.post("/ui/login", data=data, follow_redirects=False)
        assert response.status_code == 403 and "stale or forged" in response.text
        assert SESSION not in response.headers.get("set-cookie", "")
    right = _form_csrf(client.get("/ui/login").text)
    altered = ("y" if right[0] == "x" else "x") + right[1:]  # never the form's own token
    wrong = client.post("/ui/login", data={"token": api_tokens.support, "csrf": altered})
    assert wrong.status_code == 403
    assert client.get("/ui").status_code == 401  # still signed out


def test_sign_out_needs_the_csrf_token_and_can_revoke_the_token(
    client: TestClient, api_tokens: Tokens
) -> None:
    _sign_in(client, api_tokens.support)
    forged = client.post("/ui/logout", data={"revoke": "true"}, follow_redirects=False)
    assert forged.status_code == 403
    assert client.get("/ui").status_code == 200  # still signed in, token alive
    csrf = _form_csrf(client.get("/ui").text)
    out = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and client.get("/ui").status_code == 401
    assert client.get("/v1/status", headers=api_tokens.auth("support")).status_code == 200

    _sign_in(client, api_tokens.support)
    csrf = _form_csrf(client.get("/ui").text)
    revoked = client.post(
        "/ui/logout", data={"csrf": csrf, "revoke": "true"}, follow_redirects=False
    )
    assert revoked.status_code == 303 and client.get("/ui").status_code == 401
    assert client.get("/v1/status", headers=api_tokens.auth("support")).status_code == 401


def test_values_are_escaped(client: TestClient, api_tokens: Tokens, engine: Engine) -> None:
    with engine.begin() as conn:
        effect = add_effect(conn, "xss", recipient="<script>alert(1)</script>")
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_effect_page_masks_what_receivers_echoed_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = leaky(engine)
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}").text
    assert PAN[:4] not in page
    assert "HTTP 422: card *** declined" in page and "upstream said pan=***" in page
    _sign_in(client, api_tokens.operator)
    assert f"HTTP 422: card {PAN} declined" in client.get(f"/ui/effects/{effect.key}").text


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
    assert "No key, committed batch, reference or recipient" in missing.text


def test_with_the_database_down_no_page_shows_the_drivers_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Host, port and the driver's words are for the server log; every visitor, signed
    in or not, and every API client reads the same plain sentence."""
    port = free_port()  # nothing listens there
    settings = Settings(database_url=f"postgresql://outbox:pw@127.0.0.1:{port}/outbox")
    caplog.set_level(logging.ERROR, logger="spark_outbox.api.errors")
    with TestClient(create_app(settings), base_url="https://testserver") as down:
        form = down.get("/ui/login")  # needs no database
        answers = [
            down.get("/ui"),
            down.get(f"/ui/effects/{'a' * 64}"),
            down.post("/ui/login", data={"token": "obx_x", "csrf": _form_csrf(form.text)}),
            down.get("/ui", headers={"Cookie": f"{SESSION}=obx_someone"}),
            down.get("/v1/status", headers={"Authorization": "Bearer obx_someone"}),
        ]
    for response in answers:
        assert response.status_code == 503, response.request.url
        text = response.text
        assert "the database is unavailable; retry" in text
        for leak in (str(port), "127.0.0.1", "refused", "OperationalError"):
            assert leak not in text, (response.request.url, leak)
    logged = [r for r in caplog.records if getattr(r, "event", "") == "api.database_unavailable"]
    assert len(logged) == len(answers)
    assert all(f"port {port}" in r.error and "refused" in r.error for r in logged)
