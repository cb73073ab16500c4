"""The automatic half of "failing endpoints": an endpoint failing continuously for
``auto_disable_after_s`` (a second here) is paused by the system, on real
PostgreSQL, with a real worker against a real receiver that answers 503."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.console import operations, tokens
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from tests.api.test_ui import _sign_in
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, run_worker

REASON = "disabled automatically: failing continuously since "


def test_an_endpoint_failing_continuously_is_disabled_by_the_system_and_shown(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/down", 503)
    with engine.begin() as conn:
        add_webhook(conn, name="down", url=receiver.url("/down"))
        add_webhook(conn, name="idle", url=receiver.url("/idle"))
    procs.enqueue_many(engine, 12, endpoint="down")
    settings = dataclasses.replace(fast, auto_disable_after_s=1.0)
    # The worker stops once nothing is claimable: after the endpoint was disabled.
    assert run_worker(settings, engine, timeout_s=30) == 0
    with engine.connect() as conn:
        enabled, reason = conn.execute(
            sa.text("SELECT enabled, paused_reason FROM endpoints WHERE name = 'down'")
        ).one()
        actions = conn.execute(
            sa.text("SELECT actor, action, target, reason FROM operator_actions ORDER BY id")
        ).all()
        idle = conn.execute(sa.text("SELECT enabled FROM endpoints WHERE name = 'idle'")).scalar()
    assert enabled is False and reason.startswith(REASON), reason
    assert "failed attempts, no delivery since" in reason
    # The breaker's rests on the way (each the system's), then the disable.
    assert [tuple(a) for a in actions][-1] == ("system", "disable_endpoint", "down", reason)
    assert {(a.actor, a.action, a.target) for a in actions[:-1]} == {
        ("system", "rest_endpoint", "down")
    }
    assert idle is True
    with engine.begin() as conn:
        _, support = tokens.create(conn, name="sam", role="support")
    with TestClient(create_app(settings), base_url="https://testserver") as client:
        status = client.get("/v1/status", headers={"Authorization": f"Bearer {support}"})
        shown = {e["name"]: e for e in status.json()["endpoints"]}
        assert shown["down"]["enabled"] is False and shown["down"]["paused_reason"] == reason
        assert shown["down"]["state"] == "disabled" and shown["down"]["state_reason"] == reason
        _sign_in(client, support)
        assert REASON in client.get("/ui").text


def test_one_old_failure_does_not_disable_an_idle_endpoint(engine: Engine) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="quiet", url="http://127.0.0.1:9/quiet")
        # Failing since long ago, but only 3 failed attempts: idle, not failing.
        conn.execute(
            sa.text(
                "UPDATE endpoint_budgets SET failures = 3,"
                " failing_since = now() - interval '30 days' WHERE endpoint = 'quiet'"
            )
        )
        assert store.disable_failing(conn, after_s=5 * 86400) == []
        conn.execute(sa.text("UPDATE endpoint_budgets SET failures = 10"))
        assert store.disable_failing(conn, after_s=5 * 86400) == ["quiet"]
        assert store.disable_failing(conn, after_s=5 * 86400) == []  # once
        operations.resume_endpoint(conn, "quiet", actor="ops", reason="receiver fixed")
        streak = conn.execute(
            sa.text("SELECT failures, failing_since FROM endpoint_budgets WHERE endpoint = 'quiet'")
        ).one()
    assert tuple(streak) == (0, None)  # a resumed endpoint starts a new streak
