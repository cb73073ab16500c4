"""After retention, nothing of what a receiver echoed of the payload is left to show:
the effect, its last error and its attempts are deleted, and what the API, the
support page and the CSV export still say of its key comes from the key ledger
(state, endpoint, when), which never held outside text."""

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
        assert main(["--log-format", "text", "purge", "--older-than", "30d"]) == 0


def test_a_purged_effects_echo_of_the_payload_is_gone_from_every_view(
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
    for role in ("support", "operator"):
        detail = client.get(f"/v1/effects/{effect.key}", headers=api_tokens.auth(role))
        assert detail.status_code == 404 and "dead-lettered on" in detail.json()["detail"]
    now = dt.datetime.now(dt.UTC)
    window = {
        "since": (now - dt.timedelta(days=60)).isoformat(),
        "until": (now + dt.timedelta(days=1)).isoformat(),
    }
    auth = api_tokens.auth("support")
    exported = client.get("/v1/effects.csv", params=window, headers=auth).text
    assert effect.key not in exported
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{effect.key}").text
    assert "retention has deleted its record" in page
    with engine.connect() as conn:
        texts = conn.execute(
            sa.text(
                "SELECT coalesce(string_agg(error || response_excerpt, ''), '')"
                " FROM delivery_attempts WHERE effect_id = :id"
            ),
            {"id": effect.id},
        ).scalar_one()
    for shown in (detail.text, exported, page, texts):
        assert PAN not in shown and SPACED not in shown and PAN[:8] not in shown
