"""Send-by times on the read and operate side: status and batch counts, the effect's
send-by time in the API, the CLI and on the support page, /metrics, requeue (a new
send-by time needed once it has passed) and the uncertain send-again (refused then)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import tokens
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.dispatch import store
from tests.api.conftest import Tokens, window
from tests.api.test_ui import _sign_in

KEY = effect_key("expiry", "reset-code")


def _expired(engine: Engine, key: str = KEY) -> None:
    """A password-reset mail enqueued with a send-by time already past, then expired
    by the dispatcher's expiry pass."""
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=key,
            endpoint="billing-webhook",
            payload={"code": "123456"},
            expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        )
    assert store.expire_due(engine) == [(key, "billing-webhook")]


def _state(engine: Engine, key: str = KEY) -> tuple[str, dt.datetime | None]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT state, expires_at FROM effects WHERE idempotency_key = :k"),
            {"k": key},
        ).one()
    return row[0], row[1]


def test_an_expired_effect_is_counted_and_shown_with_its_send_by_time_and_reason(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    _expired(engine)
    auth = api_tokens.auth("support")
    assert client.get("/v1/status", headers=auth).json()["counts"]["expired"] == 1
    detail = client.get(f"/v1/effects/{KEY}", headers=auth).json()
    effect = detail["effect"]
    assert effect["state"] == "expired" and effect["next_attempt_at"] is None
    assert effect["expires_at"].endswith("Z")
    assert effect["last_error"].startswith("not sent: its send-by time ")
    query = {"state": "expired", **window()}
    found = client.get("/v1/effects", params=query, headers=auth).json()
    assert [e["idempotency_key"] for e in found["items"]] == [KEY]
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{KEY}").text
    assert re.search(r'id="effect-send-by"><time [^>]*>[^<]*</time>: passed before it was', page)
    assert 'id="expired-note"' in page and "Requeue" not in page  # support: no buttons
    home = client.get("/ui").text
    assert re.search(r"<span>expired</span><strong>1</strong>", home)


def test_metrics_count_the_effects_that_expired_in_the_last_day(
    client: TestClient, engine: Engine
) -> None:
    _expired(engine)
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
    }
    assert samples["outbox_recent_expired_effects"] == 1
    assert samples.get("outbox_queue_depth") == 0  # past its send-by time: never due


def test_requeue_of_an_expired_effect_needs_a_new_send_by_time_in_the_future(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    _expired(engine)
    auth, url = api_tokens.auth("operator"), f"/v1/effects/{KEY}/requeue"
    bare = client.post(url, json={"reason": "customer asked again"}, headers=auth)
    assert bare.status_code == 422
    (problem,) = bare.json()["detail"]
    assert problem["loc"][-1] == "expires_at" and "has passed" in problem["msg"]
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    assert (
        client.post(url, json={"reason": "r", "expires_at": past}, headers=auth).status_code == 422
    )
    assert _state(engine)[0] == "expired"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=15)
    done = client.post(url, json={"reason": "r", "expires_at": later.isoformat()}, headers=auth)
    assert done.status_code == 200, done.text
    assert _state(engine) == ("pending", later)
    actions = client.get("/v1/operator-actions", headers=auth).json()
    assert actions[0]["action"] == "requeue" and actions[0]["details"]["expires_at"]


def test_bulk_requeue_leaves_dead_effects_past_their_send_by_time_dead(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        for name, expires in (("late", now - dt.timedelta(seconds=1)), ("fine", None)):
            enqueue(
                conn,
                idempotency_key=effect_key("bulk", name),
                endpoint="billing-webhook",
                payload={},
                expires_at=expires,
            )
        conn.execute(sa.text("UPDATE effects SET state = 'dead'"))
    body = {
        "reason": "receiver fixed",
        "since": (now - dt.timedelta(hours=1)).isoformat(),
        "until": (now + dt.timedelta(hours=1)).isoformat(),
        "dry_run": False,
    }
    done = client.post("/v1/effects/bulk-requeue", json=body, headers=api_tokens.auth("operator"))
    assert done.json()["requeued"] == 1
    assert _state(engine, effect_key("bulk", "late"))[0] == "dead"
    assert _state(engine, effect_key("bulk", "fine"))[0] == "pending"


def test_an_uncertain_effect_past_its_send_by_time_is_not_sent_again(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=KEY,
            endpoint="billing-email",
            payload={"subject": "Your code", "text": "123456"},
            recipient="ada@example.com",
            expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1),
        )
        conn.execute(sa.text("UPDATE effects SET state = 'uncertain'"))
    auth = api_tokens.auth("operator")
    again = client.post(
        f"/v1/effects/{KEY}/resolve",
        json={"action": "send_again", "reason": "customer asks", "dry_run": False},
        headers=auth,
    )
    assert again.status_code == 409 and "send-by time" in again.json()["detail"]
    assert _state(engine)[0] == "uncertain"
    marked = client.post(
        f"/v1/effects/{KEY}/resolve",
        json={"action": "mark_delivered", "reason": "customer has it", "dry_run": False},
        headers=auth,
    )
    assert marked.status_code == 200, marked.text


def test_the_support_pages_requeue_button_takes_a_new_send_by_time(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    _expired(engine)
    _sign_in(client, api_tokens.operator)
    page = client.get(f"/ui/effects/{KEY}").text
    assert 'name="expires_at"' in page
    csrf = tokens.csrf_token(api_tokens.operator)
    url = f"/ui/effects/{KEY}/requeue"
    refused = client.post(url, data={"reason": "r", "csrf": csrf, "expires_at": "tomorrow"})
    assert refused.status_code == 422 and "expires_at" in refused.text
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    done = client.post(
        url, data={"reason": "r", "csrf": csrf, "expires_at": later}, follow_redirects=False
    )
    assert done.status_code == 303
    assert _state(engine)[0] == "pending"


def test_the_cli_requeues_an_expired_effect_only_with_a_new_send_by_time(
    db_url: str, engine: Engine, endpoints: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _expired(engine)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        cli = ["--log-format", "text", "effects", "requeue", KEY, "--reason", "asked again"]
        assert main(cli) == 2
        assert "expires_at: the effect's send-by time" in capsys.readouterr().err
        later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
        assert main([*cli, "--expires-at", later]) == 0
        assert main(["--log-format", "text", "effects", "show", KEY]) == 0
    out = capsys.readouterr().out
    assert f"requeued {KEY}: pending, due now, send-by time {later}" in out
    assert re.search(r"^send_by +\d{4}-", out, re.MULTILINE)


def test_a_resend_past_the_send_by_time_is_refused_and_a_bulk_resend_counts_it(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        for name, offset_s in (("late", -1), ("fine", 3600)):
            enqueue(
                conn,
                idempotency_key=effect_key("resend", name),
                endpoint="billing-webhook",
                payload={},
                recipient="ada@example.com",
                expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s),
            )
        conn.execute(sa.text("UPDATE effects SET state = 'delivered', delivered_at = now()"))
    auth = api_tokens.auth("operator")
    late = effect_key("resend", "late")
    one = client.post(
        f"/v1/effects/{late}/resend", json={"reason": "lost", "dry_run": False}, headers=auth
    )
    assert one.status_code == 409 and "send-by time" in one.json()["detail"]
    bulk = client.post(
        "/v1/effects/bulk-resend",
        json={"reason": "lost", "recipient": "ada@example.com", "dry_run": True},
        headers=auth,
    ).json()
    assert bulk["matched"] == 1 and bulk["refused"] == {"past its send-by time": 1}
    assert _state(engine, late)[0] == "delivered"
