"""Reconciliation of batches with every kind of gap: built with the real store, real
deliveries by a real worker to a real receiver, retention, and a broken marker."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import operations
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import retention
from tests.api.builders import add_batch
from tests.api.conftest import Tokens
from tests.dispatcher.conftest import Receiver, run_worker

JOB = "billing"
GOOD = "stream-7/42"  # a streaming batch id: it holds a '/'
BROKEN = "2026-11-22"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _count(lines: list[dict[str, object]]) -> dict[str, object]:
    return {line["category"]: line["count"] for line in lines if line["count"]}  # type: ignore[misc]


def _build(engine: Engine, settings: Settings, receiver: Receiver) -> None:
    receiver.script("/bad", 400)
    with engine.begin() as conn:
        add_webhook(conn, name="ok", url=receiver.url("/ok"))
        add_webhook(conn, name="bad", url=receiver.url("/bad"))
        rows = [{"name": n, "endpoint": "ok"} for n in ("d1", "d2", "p1", "c1")]
        built = add_batch(
            conn,
            JOB,
            GOOD,
            [*rows, {"name": "x1", "endpoint": "bad"}],
            effects_total=7,
            effects_deduplicated=2,
            payload_mismatches=1,
            rejects=1,
        )
        conn.execute(
            sa.text(
                "INSERT INTO rejects (job, batch_id, reason, raw_row) "
                "VALUES (:j, :b, 'payload: is not valid JSON', '{}')"
            ),
            {"j": JOB, "b": GOOD},
        )
        later = "UPDATE effects SET next_attempt_at = now() + interval '1 hour' WHERE id = :id"
        conn.execute(sa.text(later), {"id": built[2].id})
        operations.cancel(conn, built[3].key, actor="olga", reason="customer left")
    fast = dataclasses.replace(settings, poll_interval_s=0.1, retry_schedule_s=(0.0,))
    assert run_worker(fast, engine) == 0  # d1, d2 delivered; x1 dead (400)
    with engine.begin() as conn:  # d2 finished long ago: retention purges it
        conn.execute(
            sa.text("UPDATE effects SET updated_at = now() - interval '9 days' WHERE id = :id"),
            {"id": built[1].id},
        )
    retention.purge(engine, retention.cutoff_for(86400), batch_size=10)
    with engine.begin() as conn:
        broken = add_batch(
            conn,
            JOB,
            BROKEN,
            [{"name": "m1"}, {"name": "m2"}],
            effects_total=3,
            effects_new=3,
            rejects=2,
        )
        conn.execute(  # says delivered, but nothing records a delivery
            sa.text("UPDATE effects SET state = 'delivered' WHERE id = :id"), {"id": broken[0].id}
        )
        conn.execute(
            sa.text(
                "INSERT INTO rejects (job, batch_id, reason, raw_row) VALUES (:j, :b, 'x', '{}')"
            ),
            {"j": JOB, "b": BROKEN},
        )


def test_every_gap_is_explained_or_reported(
    client: TestClient,
    api_tokens: Tokens,
    engine: Engine,
    settings: Settings,
    receiver: Receiver,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _build(engine, settings, receiver)
    auth = api_tokens.auth("support")
    (good,) = client.get(
        "/v1/reconcile", params={"job": JOB, "batch_id": GOOD}, headers=auth
    ).json()
    assert _count(good["lines"]) == {
        "rejected": 1,
        "deduplicated": 2,
        "delivered": 1,
        "pending": 1,
        "dead": 1,
        "cancelled": 1,
        "purged": 1,
    }
    assert good["effect_rows"] == 8 and good["unexplained"] == 0
    # attempts: of the effects still there (the purged one's left with it)
    assert good["payload_mismatches"] == 1 and good["attempts"] >= 2
    (broken,) = client.get(
        "/v1/reconcile", params={"job": JOB, "batch_id": BROKEN}, headers=auth
    ).json()
    assert _count(broken["lines"]) == {
        "pending": 1,
        "rejected": 1,
        "missing": 1,
        "rejects_missing": 1,
        "delivered_unrecorded": 1,
    }
    assert broken["unexplained"] == 3
    with engine.begin() as conn:  # the volume guard holds the batch: pending reads held
        conn.execute(
            sa.text("UPDATE batches SET hold_state = 'held' WHERE job = :j AND batch_id = :b"),
            {"j": JOB, "b": GOOD},
        )
    (held,) = client.get(
        "/v1/reconcile", params={"job": JOB, "batch_id": GOOD}, headers=auth
    ).json()
    assert _count(held["lines"])["held"] == 1 and "pending" not in _count(held["lines"])
    assert held["unexplained"] == 0
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE batches SET hold_state = NULL WHERE job = :j AND batch_id = :b"),
            {"j": JOB, "b": GOOD},
        )
    everything = client.get("/v1/reconcile", params={"job": JOB}, headers=auth).json()
    assert [r["batch_id"] for r in everything] == [BROKEN, GOOD]  # newest first

    monkeypatch.setenv("DATABASE_URL", db_url)  # a password never goes in argv
    cli = ["--log-format", "text", "reconcile", JOB]
    assert main([*cli, GOOD]) == 0
    out = capsys.readouterr().out
    assert "every row explained" in out and "purged" in out
    assert main([*cli, "--json"]) == 1  # the broken batch is unexplained
    per_batch = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["unexplained"] for r in per_batch] == [3, 0]
    assert main([*cli, "no-such-batch"]) == 2
    with engine.begin() as conn:  # its send started, the outcome unknown: uncertain
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'uncertain', send_started_at = now()"
                " WHERE job = :j AND batch_id = :b AND state = 'pending'"
            ),
            {"j": JOB, "b": GOOD},
        )
    (uncertain,) = client.get(
        "/v1/reconcile", params={"job": JOB, "batch_id": GOOD}, headers=auth
    ).json()
    assert _count(uncertain["lines"])["uncertain"] == 1 and uncertain["unexplained"] == 0
