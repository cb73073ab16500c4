"""The new endpoint fields over the API: limits and ordering set, changed, audited and
refused when out of range; an effect's page shows its ordering key."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from tests.api.conftest import Tokens


def test_limits_and_ordering_are_set_changed_and_audited(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    auth = api_tokens.auth("operator")
    body = {"reason": "partner", "name": "partner", "url": "https://partner.example.com/h"}
    made = client.post(
        "/v1/endpoints", json=body | {"max_in_flight": 5, "ordered": True}, headers=auth
    )
    assert made.status_code == 200, made.text
    endpoint = made.json()["endpoint"]
    assert (endpoint["max_in_flight"], endpoint["ordered"], endpoint["rate_limit_per_s"]) == (
        5,
        True,
        None,
    )
    bad = client.patch(
        "/v1/endpoints/partner", json={"reason": "x", "max_in_flight": 0}, headers=auth
    )
    assert bad.status_code == 422
    changes = {"reason": "calmer", "max_in_flight": None, "rate_limit_per_s": 20, "ordered": False}
    done = client.patch("/v1/endpoints/partner", json=changes, headers=auth)
    assert done.status_code == 200, done.text
    assert (done.json()["max_in_flight"], done.json()["ordered"]) == (None, False)
    with engine.connect() as conn:
        audited = conn.execute(
            sa.text(
                "SELECT details FROM operator_actions WHERE action = 'update_endpoint'"
                " AND target = 'partner'"
            )
        ).scalar_one()
    assert audited["changes"]["max_in_flight"] == {"old": 5, "new": None}
    assert audited["changes"]["ordered"] == {"old": True, "new": False}


def test_an_effects_page_shows_its_ordering_key(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    key = effect_key("ordered", 1)
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=key,
            endpoint="billing-webhook",
            payload={"n": 1},
            ordering_key="customer-7",
        )
    client.cookies.set("outbox_session", api_tokens.support)
    page = client.get(f"/ui/effects/{key}").text
    assert '<td id="effect-ordering-key">customer-7</td>' in page
