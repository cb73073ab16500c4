"""Instants, names and strings an API client can send that once ended in a 500: an
instant that leaves Python's range once in UTC (ISO 8601 allows offsets to 23:59),
an offset beyond PostgreSQL's 15:59 on the write routes, a NUL in the audit trail's
actor filter, a lone surrogate echoed in a 422. Each is now a 422 naming the field,
or, where the instant is valid, what the same instant in UTC does."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from tests.api.builders import story
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in

JSON = {"Content-Type": "application/json"}


def _field(response: object, field: str) -> str:
    assert response.status_code == 422, response.text  # type: ignore[attr-defined]
    (problem,) = response.json()["detail"]  # type: ignore[attr-defined]
    assert problem["loc"][-1] == field, problem
    return str(problem["msg"])


def test_an_instant_out_of_range_in_utc_is_a_422_naming_its_field(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"].key
    support, operator = api_tokens.auth("support"), api_tokens.auth("operator") | JSON
    late = {"since": "9999-12-31T23:59:00-23:59", "until": "9999-12-31T23:59:59-23:59"}
    for path in ("/v1/effects", "/v1/effects.csv"):
        found = client.get(path, params={"state": "pending"} | late, headers=support)
        assert "out of range once in UTC" in _field(found, "since")
    early = '"0001-01-01T00:00:00+23:59"'
    bodies = [
        (f"/v1/effects/{dead}/requeue", f'{{"reason": "r", "expires_at": {early}}}', "expires_at"),
        (
            "/v1/effects/bulk-requeue",
            f'{{"reason": "r", "endpoint": "billing-webhook", "since": {early}, '
            '"until": "2026-11-01T00:00:00Z"}',
            "since",
        ),
        (
            "/v1/effects/bulk-resend",
            f'{{"reason": "r", "endpoint": "billing-webhook", "since": {early}}}',
            "since",
        ),
        ("/v1/endpoints/billing-webhook/recover", f'{{"reason": "r", "since": {early}}}', "since"),
    ]
    for path, body, field in bodies:
        assert "out of range" in _field(client.post(path, content=body, headers=operator), field)


def test_an_offset_beyond_postgresqls_is_taken_as_its_instant_in_utc(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    dead = story(engine)["dead"].key
    operator = api_tokens.auth("operator")
    recovered = client.post(
        "/v1/endpoints/billing-webhook/recover",
        json={"reason": "r", "since": "2026-12-01T00:00:00+20:00"},
        headers=operator,
    )
    assert recovered.status_code == 200, recovered.text
    later = dt.datetime.now(dt.UTC).year + 2
    done = client.post(
        f"/v1/effects/{dead}/requeue",
        json={"reason": "r", "expires_at": f"{later}-01-01T00:00:00-16:00"},
        headers=operator,
    )
    assert done.status_code == 200, done.text
    with engine.connect() as conn:
        state, send_by = conn.execute(
            sa.text("SELECT state, expires_at FROM effects WHERE idempotency_key = :k"),
            {"k": dead},
        ).one()
    assert state == "pending"
    assert send_by == dt.datetime(later, 1, 1, 16, tzinfo=dt.UTC)


def test_a_nul_in_the_actor_filter_is_a_422_on_the_api_and_the_page(
    client: TestClient, api_tokens: Tokens
) -> None:
    answer = client.get(
        "/v1/operator-actions", params={"actor": "\x00"}, headers=api_tokens.auth("support")
    )
    _field(answer, "actor")
    _sign_in(client, api_tokens.support)
    page = client.get("/ui/audit", params={"actor": "a\x00"})
    assert page.status_code == 422, page.text


def test_a_lone_surrogate_is_echoed_escaped_in_the_422(
    client: TestClient, api_tokens: Tokens
) -> None:
    answer = client.post(
        "/v1/endpoints/billing-webhook/pause",
        content='{"reason": "\\ud800"}',
        headers=api_tokens.auth("operator") | JSON,
    )
    assert answer.status_code == 422, answer.text
    assert "\\ud800" in answer.text


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    at=st.datetimes(
        min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)
    ),
    minutes=st.integers(-(23 * 60 + 59), 23 * 60 + 59),
    text=st.text(max_size=20),
)
def test_no_instant_or_text_an_operator_sends_is_a_500(
    client: TestClient, api_tokens: Tokens, at: dt.datetime, minutes: int, text: str
) -> None:
    """Any instant ISO 8601 can write (any offset it allows), any reason and actor:
    an answer below 500 from the search, the bulk requeue and the audit trail."""
    instant = at.replace(tzinfo=dt.timezone(dt.timedelta(minutes=minutes))).isoformat()
    support, operator = api_tokens.auth("support"), api_tokens.auth("operator")
    answers = [
        client.get(
            "/v1/effects",
            params={"state": "dead", "since": instant, "until": instant},
            headers=support,
        ),
        client.post(
            "/v1/effects/bulk-requeue",
            json={
                "reason": text or "r",
                "endpoint": "billing-webhook",
                "since": instant,
                "until": instant,
            },
            headers=operator,
        ),
        client.get("/v1/operator-actions", params={"actor": text}, headers=support),
    ]
    for answer in answers:
        assert answer.status_code < 500, (instant, text, answer.text)
