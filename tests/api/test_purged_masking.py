"""After retention purges an effect, what its receivers echoed of the payload stays
masked: the purge masks ``last_error`` with the payload it is about to drop, so the
support role's effect view (API and page) and the CSV export never show the value."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from tests.api.builders import PAN, leaky
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in

SPACED = " ".join(PAN[i : i + 4] for i in range(0, 16, 4))  # as a receiver groups it


def _purge_from_the_command_line(db_url: str) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        env.setenv("OUTBOX_SENSITIVE_FIELDS", "card.pan")
        assert main(["--log-format", "text", "purge", "--older-than", "30d"]) == 0


def test_a_purged_effects_last_error_stays_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine, db_url: str
) -> None:
    effect = leaky(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'dead', last_error = :e,"
                " updated_at = now() - interval '40 days' WHERE id = :id"
            ),
            {"e": f"HTTP 422: card {SPACED} declined (pan={PAN})", "id": effect.id},
        )
    _purge_from_the_command_line(db_url)
    auth = api_tokens.auth("support")
    detail = client.get(f"/v1/effects/{effect.key}", headers=auth)
    assert detail.status_code == 200 and detail.json()["effect"]["purged_at"] is not None
    assert detail.json()["effect"]["last_error"] == "HTTP 422: card *** declined (pan=***)"
    now = dt.datetime.now(dt.UTC)
    window = {
        "since": (now - dt.timedelta(days=1)).isoformat(),
        "until": (now + dt.timedelta(days=1)).isoformat(),
        "state": "dead",
    }
    exported = client.get("/v1/effects.csv", params=window, headers=auth).text
    assert effect.key in exported and "card *** declined" in exported
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}").text
    assert "card *** declined" in page
    for shown in (detail.text, exported, page):
        assert PAN not in shown and SPACED not in shown and PAN[:8] not in shown
