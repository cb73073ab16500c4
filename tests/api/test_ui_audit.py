"""The support page's audit view shows the system's own changes beside the operators'
actions, under one actor (`system`): a breaker's rest and a 410's pause written by
the real record statement, the automatic disable, a retention run; and filters them."""

from __future__ import annotations

import datetime as dt
import re

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.console import operations
from spark_outbox.core.auditlog import SYSTEM_ACTOR
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Breaker
from spark_outbox.dispatch import retention, store
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in
from tests.conftest import insert_endpoint


def _system_changes(engine: Engine) -> None:
    """Each kind of change the system makes by itself, by the code that makes it."""
    with engine.begin() as conn:
        for i in range(3):
            enqueue(
                conn, idempotency_key=effect_key("audit", i), endpoint="billing-webhook", payload={}
            )
    claimed = store.claim(engine, "w-1", 3, 60)
    now = dt.datetime.now(dt.UTC)
    outcomes = [("retry", 503), ("retry", 503), ("gone", 410)]
    for c, (outcome, code) in zip(claimed, outcomes, strict=True):
        result = store.Result(
            c.id,
            c.lease_token,
            c.attempt,
            outcome,
            now,
            1.0,
            error=f"HTTP {code}",
            status_code=code,
        )
        store.record(engine, "w-1", [result], breaker=Breaker(failures=2, base_s=30.0))
    insert_endpoint(engine, "old-hook")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE endpoint_budgets SET failures = 12, failing_since = now() - interval "
                "'6 days' WHERE endpoint = 'old-hook'"
            )
        )
        assert store.disable_failing(conn, after_s=5 * 86400) == ["old-hook"]
    done = retention.Purged(effects=4, attempts=9, batches=1, seconds=0.1)
    retention.record_purge(engine, done, 30 * 86400, SYSTEM_ACTOR, "w-1")


def _rows(html: str) -> list[tuple[str, str, str]]:
    """(actor, action, target) of each row of the audit table, newest first."""
    cells = re.findall(
        r"<tr class=\"actor-\w+\"><td>.*?</td>\s*<td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>",
        html,
        re.S,
    )
    return [tuple(c) for c in cells]  # type: ignore[misc]


def test_the_audit_view_shows_the_systems_changes_beside_the_operators(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        operations.pause_endpoint(
            conn, "billing-email", actor="olga", reason="relay maintenance, ticket 9"
        )
    _system_changes(engine)
    _sign_in(client, api_tokens.support)
    page = client.get("/ui/audit")
    assert page.status_code == 200
    assert _rows(page.text) == [
        ("system", "purge", "effects finished more than 30d ago"),
        ("system", "disable endpoint", "old-hook"),
        ("system", "pause endpoint", "billing-webhook"),
        ("system", "rest endpoint", "billing-webhook"),
        ("olga", "pause endpoint", "billing-email"),
    ]
    assert "circuit breaker: 2 failed attempts in a row since" in page.text
    assert "(the last: HTTP 503)" in page.text and "disabled automatically" in page.text

    system_only = client.get("/ui/audit", params={"actor": "system"}).text
    assert [r[0] for r in _rows(system_only)] == ["system"] * 4
    assert "relay maintenance" not in system_only
    assert 'href="/ui/audit"' in client.get("/ui").text  # reachable from every page

    api = client.get(
        "/v1/operator-actions", params={"actor": "system"}, headers=api_tokens.auth("support")
    ).json()
    assert [(a["actor"], a["action"]) for a in api] == [
        ("system", "purge"),
        ("system", "disable_endpoint"),
        ("system", "pause_endpoint"),
        ("system", "rest_endpoint"),
    ]
    assert api[0]["details"]["worker_id"] == "w-1"


def test_the_audit_view_pages_back_by_id(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        for i in range(101):
            operations.pause_endpoint(conn, "billing-email", actor="olga", reason=f"r{i}")
    _sign_in(client, api_tokens.support)
    first = client.get("/ui/audit").text
    older = re.search(r'href="(/ui/audit\?before_id=\d+)" id="older"', first)
    assert older is not None and len(_rows(first)) == 100
    rest = client.get(older.group(1)).text
    assert len(_rows(rest)) == 1 and ">r0<" in rest and 'id="older"' not in rest
