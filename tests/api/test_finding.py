"""Finding things over the API: a batch needs no time window, its rejects (masked for
support), finished effects have no next attempt, one timestamp format everywhere,
``/`` leads to the support page and ``/docs`` needs nothing but the app."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import re
import uuid

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.schema import rejects
from spark_outbox.spark.checks import check_row, raw_json, unknown_endpoint
from tests.api.builders import story
from tests.api.conftest import Tokens, window
from tests.api.test_ui import _sign_in
from tests.conftest import insert_endpoint

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z$")


def _reject(conn: sa.Connection, n: int, raw_row: dict[str, object]) -> None:
    conn.execute(
        sa.insert(rejects).values(
            job="billing",
            batch_id="2026-11-21",
            run_id=uuid.uuid4(),
            reason=f"r{n}",
            raw_row=raw_row,
        )
    )


def test_a_batchs_effects_are_found_without_a_time_window(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    auth = api_tokens.auth("support")
    params = {"job": "billing", "batch_id": "2026-11-21", "limit": 1}
    first = client.get("/v1/effects", params=params, headers=auth).json()
    cursor = {"cursor": first["next_cursor"]}
    second = client.get("/v1/effects", params=params | cursor, headers=auth).json()
    found = {e["idempotency_key"] for e in first["items"] + second["items"]}
    assert found == {built["batch0"].key, built["batch1"].key} and second["next_cursor"] is None
    csv_rows = client.get("/v1/effects.csv", params=params, headers=auth).text.splitlines()
    assert len(csv_rows) == 3  # header + the batch's two effects
    # An open-ended search keeps its window rule.
    job_only = client.get("/v1/effects", params={"job": "billing"}, headers=auth)
    assert job_only.status_code == 422 and job_only.json()["detail"][0]["loc"][-1] == "since"


def test_a_batchs_rejects_page_newest_first_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        _reject(conn, 1, {"payload": '{"card": {"pan": "4111"}, "n": 1}', "recipient": "x"})
        _reject(conn, 2, {"payload": "{not json", "card": {"pan": "4222"}})
        _reject(conn, 3, {"customer_id": "c-3"})
    params = {"job": "billing", "batch_id": "2026-11-21", "limit": 2}
    page = client.get("/v1/rejects", params=params, headers=api_tokens.auth("support")).json()
    assert [r["reason"] for r in page["items"]] == ["r3", "r2"]
    assert page["items"][1]["raw_row"] == {"payload": "***", "card": {"pan": "***"}}
    rest = client.get(
        "/v1/rejects",
        params=params | {"cursor": page["next_cursor"]},
        headers=api_tokens.auth("support"),
    ).json()
    assert [r["reason"] for r in rest["items"]] == ["r1"] and rest["next_cursor"] is None
    assert rest["items"][0]["raw_row"]["payload"] == '{"card": {"pan": "***"}, "n": 1}'
    as_operator = client.get(
        "/v1/rejects", params=params | {"limit": 3}, headers=api_tokens.auth("operator")
    ).json()
    assert as_operator["items"][2]["raw_row"]["payload"] == '{"card": {"pan": "4111"}, "n": 1}'
    missing = client.get(
        "/v1/rejects", params={"job": "billing"}, headers=api_tokens.auth("support")
    )
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"][-1] == "batch_id"


def test_reject_reasons_that_quote_a_sensitive_value_are_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    """A job's own reason and the sink's (the e-mail contract quotes the subject) may
    quote card.pan, here grouped in fours: support sees *** in its place, operators
    the reason whole."""
    pan = "4111111111111111"
    own = {
        "endpoint": "billing-webhook",
        "payload": json.dumps({"card": {"pan": pan}}),
        "reject_reason": f"card.pan: {pan} fails the Luhn check; fix the source record",
    }
    mail = {
        "idempotency_key": "a" * 64,
        "endpoint": "mailer",
        "recipient": "dora@example.com",
        "payload": json.dumps(
            {"subject": "Your card 4111 1111 1111 1111\nexpires", "text": "", "card": {"pan": pan}}
        ),
    }
    reasons = []
    with engine.begin() as conn:
        for row in (own, mail):
            reason, _ = check_row(row, {"mailer": "email"})  # the sink's words
            assert reason is not None and "4111" in reason
            reasons.append(reason)
            conn.execute(
                sa.insert(rejects).values(
                    job="billing",
                    batch_id="2026-11-21",
                    run_id=uuid.uuid4(),
                    reason=reason,
                    raw_row=json.loads(raw_json(row)),
                )
            )
    params = {"job": "billing", "batch_id": "2026-11-21"}
    support = client.get("/v1/rejects", params=params, headers=api_tokens.auth("support")).json()
    assert [r["reason"] for r in support["items"]] == [
        reasons[1].replace("4111 1111 1111 1111", "***"),
        "card.pan: *** fails the Luhn check; fix the source record",
    ]
    operator = client.get("/v1/rejects", params=params, headers=api_tokens.auth("operator"))
    assert [r["reason"] for r in operator.json()["items"]] == reasons[::-1]


def test_finished_effects_have_no_next_attempt_and_timestamps_have_one_format(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    auth = api_tokens.auth("support")
    dead, pending = built["dead"].key, built["pending"].key
    detail = client.get(f"/v1/effects/{dead}", headers=auth).json()
    assert detail["effect"]["state"] == "dead" and detail["effect"]["next_attempt_at"] is None
    assert ISO_Z.match(
        client.get(f"/v1/effects/{pending}", headers=auth).json()["effect"]["next_attempt_at"]
    )
    search = {"recipient": "bob@example.com", **window()}
    items = {
        e["idempotency_key"]: e
        for e in client.get("/v1/effects", params=search, headers=auth).json()["items"]
    }
    rows = {
        r["idempotency_key"]: r
        for r in csv.DictReader(
            io.StringIO(client.get("/v1/effects.csv", params=search, headers=auth).text)
        )
    }
    assert items[dead]["next_attempt_at"] is None and rows[dead]["next_attempt_at"] == ""
    for key in (dead, pending):
        assert ISO_Z.match(items[key]["created_at"])
        assert rows[key]["created_at"] == items[key]["created_at"]  # the same text
    _sign_in(client, api_tokens.support)
    page = client.get(f"/ui/effects/{dead}").text
    assert "next attempt" not in page
    created = items[dead]["created_at"]
    shown = dt.datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'<time datetime="{created}">{shown}</time>' in page


def test_root_leads_to_the_support_page_and_docs_use_only_the_apps_files(
    client: TestClient,
) -> None:
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/ui"
    docs = client.get("/docs")
    assert docs.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
    assert assets and all(a.startswith("/static/") for a in assets)
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    assert client.get("/redoc").status_code == 404  # its page would need a CDN


def test_an_operator_requeues_a_batchs_unknown_endpoint_rejects_once_it_is_registered(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    row = {"idempotency_key": "ab" * 32, "endpoint": "late", "payload": '{"n": 1}'}
    with engine.begin() as conn:
        conn.execute(
            sa.insert(rejects).values(
                job="billing",
                batch_id="2026-11-21",
                reason=unknown_endpoint("late"),  # the sink's own words
                raw_row=json.loads(raw_json(row | {"recipient": None})),
            )
        )
        _reject(conn, 2, {"payload": "{not json"})  # another reason: never requeued
    body = {"job": "billing", "batch_id": "2026-11-21", "reason": "registered late"}
    refused = client.post("/v1/rejects/requeue", json=body, headers=api_tokens.auth("support"))
    assert refused.status_code == 403
    auth = api_tokens.auth("operator")
    unknown = client.post("/v1/rejects/requeue", json=body | {"dry_run": False}, headers=auth)
    assert unknown.json()["still_refused"] == {unknown_endpoint("late"): 1}
    insert_endpoint(engine, "late")
    dry = client.post("/v1/rejects/requeue", json=body, headers=auth).json()  # dry by default
    assert (dry["matched"], dry["enqueued"], dry["dry_run"]) == (1, 1, True)
    done = client.post("/v1/rejects/requeue", json=body | {"dry_run": False}, headers=auth)
    assert (done.status_code, done.json()["enqueued"]) == (200, 1)
    effect = client.get(f"/v1/effects/{'ab' * 32}", headers=auth)
    assert effect.status_code == 200 and effect.json()["effect"]["state"] == "pending"
    batch = {"job": "billing", "batch_id": "2026-11-21"}
    page = client.get("/v1/rejects", params=batch, headers=auth).json()
    requeued = {r["reason"]: r["requeued_at"] is not None for r in page["items"]}
    assert requeued == {unknown_endpoint("late"): True, "r2": False}
    blank = client.post("/v1/rejects/requeue", json=body | {"reason": " "}, headers=auth)
    assert blank.status_code == 422


def test_a_rejects_cursor_beyond_any_row_id_is_a_422_naming_the_cursor(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        _reject(conn, 1, {"customer_id": "c-1"})
    params = {"job": "billing", "batch_id": "2026-11-21"}
    auth = api_tokens.auth("support")
    for reject_id in (2**63, 10**30, 0, -5):
        cursor = base64.urlsafe_b64encode(f"reject:{reject_id}".encode()).decode().rstrip("=")
        response = client.get("/v1/rejects", params=params | {"cursor": cursor}, headers=auth)
        assert response.status_code == 422, reject_id
        (item,) = response.json()["detail"]
        assert item["loc"] == ["query", "cursor"] and "pass next_cursor unchanged" in item["msg"]
    largest = base64.urlsafe_b64encode(f"reject:{2**63 - 1}".encode()).decode().rstrip("=")
    page = client.get("/v1/rejects", params=params | {"cursor": largest}, headers=auth)
    assert [r["reason"] for r in page.json()["items"]] == ["r1"]


def test_nan_or_infinity_in_an_operators_json_body_is_a_422_naming_the_field(
    client: TestClient, api_tokens: Tokens
) -> None:
    """Python's JSON parser reads NaN and Infinity; every numeric field refuses them."""
    auth = api_tokens.auth("operator") | {"Content-Type": "application/json"}
    week = '"since": "2026-11-01T00:00:00Z", "until": "2026-11-08T00:00:00Z"'
    cases = [
        ("POST", "/v1/effects/bulk-requeue", f'{{"reason": "r", {week}, "cap": NaN}}', "cap"),
        (
            "POST",
            "/v1/endpoints/billing-webhook/rotate-secret",
            '{"reason": "r", "overlap_s": NaN}',
            "overlap_s",
        ),
        (
            "POST",
            "/v1/endpoints/billing-webhook/recover",
            '{"reason": "r", "since": "2026-11-01T00:00:00Z", "cap": Infinity}',
            "cap",
        ),
        (
            "POST",
            "/v1/rejects/requeue",
            '{"reason": "r", "job": "billing", "batch_id": "b", "cap": -Infinity}',
            "cap",
        ),
        (
            "POST",
            "/v1/endpoints",
            '{"reason": "r", "name": "n", "url": "https://example.com/", "timeout_s": NaN}',
            "timeout_s",
        ),
        (
            "PATCH",
            "/v1/endpoints/billing-webhook",
            '{"reason": "r", "rate_limit_per_s": NaN}',
            "rate_limit_per_s",
        ),
        (
            "PATCH",
            "/v1/endpoints/billing-webhook",
            '{"reason": "r", "max_in_flight": Infinity}',
            "max_in_flight",
        ),
        (
            "PATCH",
            "/v1/endpoints/billing-webhook",
            '{"reason": "r", "retry_schedule_s": [1, NaN]}',
            1,
        ),
    ]
    for method, url, text, field in cases:
        response = client.request(method, url, content=text, headers=auth)
        assert response.status_code == 422, (url, text)
        (item,) = response.json()["detail"]
        assert item["loc"][-1] == field, (url, text)
