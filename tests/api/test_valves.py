"""Held batches and corrections through the API, the support page and /metrics."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key, superseded_key
from tests.api.builders import add_batch
from tests.api.conftest import Tokens
from tests.api.test_metrics import _samples

REASON = "billing-webhook: 500 new effects, above 10x the median 20 of the last 20 batches"


def _held_batch(engine: Engine) -> list[str]:
    """A batch the guard held (its rows carry the marker's run and are parked at
    'infinity', as the commit leaves them), and one with mismatches."""
    with engine.begin() as conn:
        rows = [{"name": f"i{i}"} for i in range(3)]
        built = add_batch(conn, "billing", "2026-01-05", rows)
        conn.execute(
            sa.text(
                "UPDATE batches SET hold_state = 'held', hold_reason = :r "
                "WHERE batch_id = '2026-01-05'"
            ),
            {"r": REASON},
        )
        conn.execute(
            sa.text(
                "UPDATE effects e SET run_id = b.run_id, next_attempt_at = 'infinity' "
                "FROM batches b WHERE b.batch_id = '2026-01-05' AND e.batch_id = b.batch_id"
            )
        )
        add_batch(conn, "billing", "2026-01-04", [], payload_mismatches=2)
    return [b.key for b in built]


def _claimable(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM claimable_effects")).scalar_one())


def test_a_held_batch_shows_everywhere_and_an_operator_releases_it(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    keys = _held_batch(engine)
    assert _claimable(engine) == 0
    status = client.get("/v1/status", headers=api_tokens.auth("support")).json()
    assert [(b["batch_id"], b["pending"], b["hold_reason"]) for b in status["held_batches"]] == [
        ("2026-01-05", 3, REASON)
    ]
    assert [(m["batch_id"], m["payload_mismatches"]) for m in status["payload_mismatches"]] == [
        ("2026-01-04", 2)
    ]
    samples = _samples(client.get("/metrics").text)
    assert samples[("outbox_held_batches", ())] == 1 and samples[("outbox_held_effects", ())] == 3
    assert samples[("outbox_recent_payload_mismatches", ())] == 2
    effect = client.get(f"/v1/effects/{keys[0]}", headers=api_tokens.auth("support")).json()
    assert effect["effect"]["next_attempt_at"] is None  # parked: not scheduled while held
    client.cookies.set("outbox_session", api_tokens.support)
    effect_page = client.get(f"/ui/effects/{keys[0]}").text
    assert "held: batch billing / 2026-01-05 held because" in effect_page
    batch_page = client.get("/ui/batch", params={"job": "billing", "batch_id": "2026-01-05"}).text
    assert 'id="batch-hold"' in batch_page and "500 new effects" in batch_page
    assert "Held batches" in client.get("/ui").text

    body = {"job": "billing", "batch_id": "2026-01-05", "reason": "expected growth"}
    refused = client.post("/v1/batches/release", json=body, headers=api_tokens.auth("support"))
    assert refused.status_code == 403
    operator = api_tokens.auth("operator")
    dry = client.post("/v1/batches/release", json=body | {"dry_run": True}, headers=operator)
    assert dry.json() == {
        **body_without_reason(body),
        "action": "release",
        "effects": 3,
        "dry_run": True,
    }
    assert _claimable(engine) == 0
    done = client.post("/v1/batches/release", json=body, headers=operator)
    assert done.status_code == 200 and done.json()["effects"] == 3 and _claimable(engine) == 3
    again = client.post("/v1/batches/cancel", json=body, headers=operator)
    assert again.status_code == 409 and "released; only a held batch" in again.text
    unknown = client.post("/v1/batches/cancel", json=body | {"batch_id": "x"}, headers=operator)
    assert unknown.status_code == 404
    marker = client.get("/v1/batches/billing/2026-01-05", headers=operator).json()["marker"]
    assert (marker["hold_state"], marker["hold_reason"]) == ("released", REASON)
    actions = client.get("/v1/operator-actions", headers=operator).json()
    assert [(a["action"], a["target"], a["actor"]) for a in actions] == [
        ("release_batch", "billing/2026-01-05", "olga")
    ]


def body_without_reason(body: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in body.items() if k != "reason"}


def test_the_audit_shows_a_correction_chain_both_ways(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    first = effect_key("invoice.issued", "INV-7")
    second = effect_key("invoice.issued", "INV-7", revision=2)
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=first, endpoint="billing-webhook", payload={"amount": 1})
        enqueue(
            conn,
            idempotency_key=second,
            endpoint="billing-webhook",
            payload={"amount": 2},
            supersedes=superseded_key("invoice.issued", "INV-7", revision=2),
        )
    auth = api_tokens.auth("support")
    assert client.get(f"/v1/effects/{first}", headers=auth).json()["superseded_by"] == [second]
    assert client.get(f"/v1/effects/{second}", headers=auth).json()["effect"]["supersedes"] == first
    client.cookies.set("outbox_session", api_tokens.support)
    assert f'href="/ui/effects/{second}"' in client.get(f"/ui/effects/{first}").text
    assert f'href="/ui/effects/{first}"' in client.get(f"/ui/effects/{second}").text


def test_the_cli_lists_counts_and_cancels_a_held_batch(
    db_url: str, engine: Engine, endpoints: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.dispatcher.test_cli import _cli

    _held_batch(engine)
    assert _cli(db_url, "batches", "held") == 0
    assert "billing / 2026-01-05  committed" in capsys.readouterr().out
    cancel = ("batches", "cancel", "billing", "2026-01-05", "--reason", "bad join")
    assert _cli(db_url, *cancel, "--dry-run") == 0
    assert "dry run: cancel would change 3 effect(s)" in capsys.readouterr().out
    assert _cli(db_url, *cancel, "--json") == 0
    assert json.loads(capsys.readouterr().out)["effects"] == 3
    with engine.connect() as conn:
        states = conn.execute(sa.text("SELECT DISTINCT state FROM effects WHERE job = 'billing'"))
        assert [s for (s,) in states] == ["cancelled"]
    assert _cli(db_url, *cancel) == 2  # no longer held: a one-line error
    assert "cancelled; only a held batch can be cancelled" in capsys.readouterr().err
