"""POST /v1/erase: operators only; a dry run by default that lists and changes
nothing; the erasure itself audited without the person's value; bad input a 422
naming the field."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.api.builders import story
from tests.api.conftest import Tokens

BOB = "bob@example.com"


def _recipients(engine: Engine) -> list[str | None]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT recipient FROM effects ORDER BY id")).scalars())


def test_erase_is_a_dry_run_by_default_and_then_erases_for_an_operator_only(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    made = story(engine)
    body = {"recipient": BOB, "reason": f"erasure request from {BOB}"}
    assert (
        client.post("/v1/erase", json=body, headers=api_tokens.auth("support")).status_code == 403
    )
    before = _recipients(engine)

    response = client.post("/v1/erase", json=body, headers=api_tokens.auth("operator"))
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["dry_run"] and plan["effects"] == 2 and plan["cancelled"] == 1
    assert {x["idempotency_key"]: x["plan"] for x in plan["listed"]} == {
        made["dead"].key: "erase",
        made["pending"].key: "cancel",
    }
    assert _recipients(engine) == before

    response = client.post(
        "/v1/erase", json=body | {"dry_run": False}, headers=api_tokens.auth("operator")
    )
    assert response.status_code == 200, response.text
    done = response.json()
    assert (done["effects"], done["cancelled"], done["complete"]) == (2, 1, True)
    assert BOB not in _recipients(engine) and before.count(BOB) == 2
    erase = next(
        a
        for a in client.get("/v1/operator-actions", headers=api_tokens.auth("support")).json()
        if a["action"] == "erase"
    )
    assert erase["id"] == done["action_id"] and erase["actor"] == "olga"
    assert erase["reason"] == "erasure request from [erased]"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "asked"}, "recipient"),
        ({"recipient": BOB, "reference": "INV-1", "reason": "asked"}, "reference"),
        ({"payload_field": "customer.idd=7", "reason": "asked"}, "payload_field"),
        ({"recipient": BOB, "reason": " "}, "reason"),
    ],
)
def test_bad_erase_input_is_a_422_naming_the_field(
    client: TestClient, api_tokens: Tokens, engine: Engine, body: dict[str, str], field: str
) -> None:
    story(engine)
    response = client.post(
        "/v1/erase", json=body | {"dry_run": False}, headers=api_tokens.auth("operator")
    )
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", field]
    assert BOB in _recipients(engine)
