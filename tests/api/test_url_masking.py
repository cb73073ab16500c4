"""A webhook URL may carry its secret in the path (``/services/T000/B000/<token>``),
not only in the query: wherever a URL reaches the support role (the operators' audit
trail, the effect view and the CSV export's receiver texts) the path segments that
are not plain words are ``***``, as are the query values."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.masking import masked_url
from tests.api.builders import add_attempt, add_effect
from tests.api.conftest import Tokens

SECRET = "XXXXSECRETxxxx0123456789"
HOOK = f"https://hooks.example/services/T000/B000/{SECRET}"
SHOWN = "https://hooks.example/services/***/***/***"


def test_a_url_shows_its_host_and_plain_words_only() -> None:
    assert masked_url(HOOK) == SHOWN
    assert masked_url("https://h.example:8443/api/v2/billing-events/") == (
        "https://h.example:8443/api/v2/billing-events/"
    )
    assert masked_url("https://h.example/hooks/catch/123456/abcdefghijkl0/?a=1#frag") == (
        "https://h.example/hooks/catch/***/***/?a=%2A%2A%2A#***"
    )
    assert masked_url("https://h.example/hooks/kpqzvxwtrsmnbq") == "https://h.example/hooks/***"
    assert masked_url("https://user:pw@h.example/x") == "https://***@h.example/x"


def test_a_secret_in_a_url_path_never_reaches_support_through_the_audit_trail(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:  # a row recorded before paths were masked
        conn.execute(
            sa.text(
                "INSERT INTO operator_actions (actor, action, target, reason, details)"
                " VALUES ('olga', 'create_endpoint', 'old-hook', 'new', CAST(:d AS jsonb))"
            ),
            {"d": json.dumps({"kind": "webhook", "url": HOOK})},
        )
    body = {"reason": "receiver moved", "url": HOOK}
    auth = api_tokens.auth("operator")
    assert client.patch("/v1/endpoints/billing-webhook", json=body, headers=auth).status_code == 200
    trail = client.get("/v1/operator-actions", headers=api_tokens.auth("support"))
    assert trail.status_code == 200
    assert SECRET not in trail.text and "T000" not in trail.text
    changed, created = trail.json()
    assert changed["details"]["changes"]["url"]["new"] == SHOWN
    assert created["details"]["url"] == SHOWN


def test_a_url_in_a_receivers_text_is_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    error = f"HTTP 410: hook gone, post to {HOOK}?token=t0k3n instead"
    with engine.begin() as conn:
        effect = add_effect(conn, "moved", payload={"card": {"pan": "4111111111111111"}})
        add_attempt(conn, effect, "dead", status_code=410, error=error, excerpt=error)
    auth = api_tokens.auth("support")
    detail = client.get(f"/v1/effects/{effect.key}", headers=auth)
    now = dt.datetime.now(dt.UTC)
    window = {
        "since": (now - dt.timedelta(days=1)).isoformat(),
        "until": (now + dt.timedelta(days=1)).isoformat(),
        "state": "dead",
    }
    exported = client.get("/v1/effects.csv", params=window, headers=auth).text
    assert effect.key in exported
    for shown in (detail.text, exported):
        assert SECRET not in shown and "t0k3n" not in shown
        assert f"post to {SHOWN}?token=%2A%2A%2A instead" in shown
    operator = client.get(f"/v1/effects/{effect.key}", headers=api_tokens.auth("operator"))
    assert SECRET in operator.text
