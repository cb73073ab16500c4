"""The read endpoints: status, effect timeline, search with keyset pages, CSV, batches."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import unicodedata

import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.api.routes.effects import spreadsheet_safe
from spark_outbox.core import masking, queue
from spark_outbox.core.schema import key_ledger
from tests.api.builders import PAN, add_effect, leaky, story
from tests.api.conftest import Tokens, window


def test_status_reports_counts_workers_endpoints_and_batches(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    story(engine)
    with engine.begin() as conn:  # the dead one's failure, as the record keeps the streak
        conn.execute(
            sa.text(
                "UPDATE endpoint_budgets SET failures = 1, failing_since = now(), "
                "last_failure = 'HTTP 400' WHERE endpoint = 'billing-webhook'"
            )
        )
    body = client.get("/v1/status", headers=api_tokens.auth("support")).json()
    assert body["counts"] == {
        "pending": 3,
        "leased": 0,
        "delivered": 1,
        "dead": 1,
        "cancelled": 0,
        "uncertain": 0,
        "expired": 0,
    }
    assert body["queue"]["depth"] == 3 and body["queue"]["oldest_due_age_s"] >= 0
    assert body["delivered_last_5m"] == 1 and body["delivered_last_1h"] == 1
    assert [w["worker_id"] for w in body["live_workers"]] == ["worker-1"]
    hooks = {e["name"]: e for e in body["endpoints"]}
    assert hooks["billing-webhook"]["last_delivered_at"] is not None
    assert hooks["billing-webhook"]["consecutive_failures"] == 1  # the dead one after it
    assert hooks["billing-webhook"]["state"] == "failing"
    assert hooks["billing-webhook"]["last_failure"] == "HTTP 400"
    assert hooks["billing-webhook"]["state_reason"].startswith("1 failed attempt in a row since")
    assert hooks["billing-email"]["state"] == "ready"
    assert sum(e["due_now"] for e in body["endpoints"]) == body["queue"]["depth"]
    assert hooks["billing-email"]["enabled"] is True
    assert body["last_batches"][0]["job"] == "billing"
    assert body["last_batches"][0]["batch_id"] == "2026-11-21"


def test_effect_shows_its_attempt_timeline(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    response = client.get(
        f"/v1/effects/{built['delivered'].key}", headers=api_tokens.auth("operator")
    )
    body = response.json()
    assert body["effect"]["state"] == "delivered"
    assert [(a["outcome"], a["status_code"]) for a in body["attempts"]] == [
        ("retry", 503),
        ("delivered", 200),
    ]
    assert body["attempts"][0]["response_excerpt"] == "busy"
    assert body["effect"]["payload"]["card"]["pan"] == "4111"  # operators see everything
    assert body["batch"] is None


def test_sensitive_payload_fields_are_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    body = client.get(
        f"/v1/effects/{built['delivered'].key}", headers=api_tokens.auth("support")
    ).json()
    assert body["effect"]["payload"] == {"invoice": "inv-1", "card": {"pan": "***"}}


def test_receiver_text_is_masked_for_support_like_the_payload(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    """A receiver that echoes card.pan (sensitive) shows support ***: in a JSON excerpt
    field by field, in prose, clipped mid-value, and in last_error of search and CSV."""
    effect = leaky(engine)
    support = client.get(f"/v1/effects/{effect.key}", headers=api_tokens.auth("support")).json()
    assert PAN[:4] not in json.dumps(support)
    first, second = support["attempts"]
    assert first["error"] == "HTTP 422: card *** declined"
    head, body = first["response_excerpt"].split("\n\n", 1)
    assert head.startswith("HTTP 422") and json.loads(body) == {
        "error": "declined",
        "card": {"pan": "***", "brand": "visa"},
    }
    assert second["response_excerpt"].endswith('{"card": {"pan": "***')
    assert support["effect"]["last_error"] == "HTTP 500: upstream said pan=***"
    params = {"recipient": "dora@example.com", **window()}
    auth = api_tokens.auth("support")
    (found,) = client.get("/v1/effects", params=params, headers=auth).json()["items"]
    assert found["last_error"] == "HTTP 500: upstream said pan=***"
    exported = client.get("/v1/effects.csv", params=params, headers=auth).text
    assert "pan=***" in exported and PAN not in exported
    operator = client.get(f"/v1/effects/{effect.key}", headers=api_tokens.auth("operator"))
    assert operator.json()["attempts"][0]["error"] == f"HTTP 422: card {PAN} declined"


SAFE_TEXT = st.text(
    st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="*"), max_size=30
)
VALUES = st.text(alphabet="0123456789abcXYZ-@.", min_size=5, max_size=24)


@given(VALUES, SAFE_TEXT, SAFE_TEXT)
def test_a_masked_value_never_survives_in_outside_text(value: str, before: str, after: str) -> None:
    payload = {"customer": {"email": value}, "lines": [{"pan": value}]}
    paths = ["customer.email", "lines.pan"]
    values = masking.masked_values(payload, paths)
    for text in (before + value + after, before + value.upper() + after):
        masked = masking.mask_text(text, paths, values)
        assert masked is not None and value.lower() not in masked.lower(), text
    # Clipped in the middle of the value: its start is masked from masking._SHORT
    # (4) characters on; a shorter start may stay, e.g. "0" of "00000" after "00".
    clipped = masking.mask_text(before + value[:-1], paths, values)
    assert clipped is not None and value.lower() not in clipped.lower(), clipped
    shortest = masking._SHORT
    kept = [k for k in range(shortest, len(value)) if clipped.lower().endswith(value[:k].lower())]
    assert not kept, clipped


def test_batch_effect_links_its_marker(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    body = client.get(
        f"/v1/effects/{built['batch0'].key}", headers=api_tokens.auth("support")
    ).json()
    assert body["effect"]["job"] == "billing"
    assert body["batch"]["batch_id"] == "2026-11-21" and body["batch"]["rejects"] == 1


def test_unknown_and_malformed_keys(client: TestClient, api_tokens: Tokens) -> None:
    auth = api_tokens.auth("support")
    assert client.get(f"/v1/effects/{'a' * 64}", headers=auth).status_code == 404
    assert client.get("/v1/effects/not-a-key", headers=auth).status_code == 422


def test_search_by_recipient_pages_with_an_opaque_cursor(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:  # one transaction: every row shares created_at
        made = {add_effect(conn, f"p-{i}", recipient="dora@example.com").key for i in range(7)}
    seen: list[str] = []
    cursor = None
    while True:
        params = {"recipient": "dora@example.com", "limit": 3, **window()}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/effects", params=params, headers=api_tokens.auth("support"))
        assert page.status_code == 200, page.text
        seen += [e["idempotency_key"] for e in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 7 and set(seen) == made


def test_search_filters_combine(client: TestClient, api_tokens: Tokens, engine: Engine) -> None:
    built = story(engine)
    params = {"job": "billing", "batch_id": "2026-11-21", "endpoint": "billing-email", **window()}
    items = client.get("/v1/effects", params=params, headers=api_tokens.auth("support")).json()
    assert [e["idempotency_key"] for e in items["items"]] == [built["batch1"].key]
    dead = client.get(
        "/v1/effects", params={"state": "dead", **window()}, headers=api_tokens.auth("support")
    ).json()
    assert [e["idempotency_key"] for e in dead["items"]] == [built["dead"].key]


def _problem(response: object) -> tuple[list[str], str]:
    detail = response.json()["detail"][0]  # type: ignore[attr-defined]
    return detail["loc"], detail["msg"]


def test_a_broad_search_without_a_time_range_is_a_clear_422(
    client: TestClient, api_tokens: Tokens
) -> None:
    response = client.get(
        "/v1/effects", params={"endpoint": "billing-webhook"}, headers=api_tokens.auth("support")
    )
    assert response.status_code == 422
    loc, msg = _problem(response)
    assert loc == ["query", "since"] and "since=" in msg


def test_a_broad_search_over_a_too_wide_range_is_a_clear_422(
    client: TestClient, api_tokens: Tokens
) -> None:
    response = client.get(
        "/v1/effects",
        params={"state": "delivered", **window(days=40)},
        headers=api_tokens.auth("support"),
    )
    assert response.status_code == 422
    loc, msg = _problem(response)
    assert loc == ["query", "until"] and "31 days" in msg


def test_search_rejects_bad_limit_cursor_and_unindexed_filters(
    client: TestClient, api_tokens: Tokens
) -> None:
    auth = api_tokens.auth("support")
    cases = [
        ({"recipient": "x", "limit": 501}, "limit"),
        ({"recipient": "x", "cursor": "bm9wZQ"}, "cursor"),
        ({}, "job"),
        ({"batch_id": "b", "endpoint": "e"}, "batch_id"),
    ]
    for params, field in cases:
        response = client.get("/v1/effects", params={**params, **window()}, headers=auth)
        assert response.status_code == 422, params
        assert response.json()["detail"][0]["loc"][-1] == field


def test_csv_export_streams_the_same_filter(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    built = story(engine)
    response = client.get(
        "/v1/effects.csv",
        params={"recipient": "bob@example.com", **window()},
        headers=api_tokens.auth("support"),
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert {r["idempotency_key"] for r in rows} == {built["dead"].key, built["pending"].key}
    assert {r["state"] for r in rows} == {"dead", "pending"}
    assert "payload" not in rows[0]


def test_batches_show_marker_and_live_counts(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    story(engine)
    auth = api_tokens.auth("support")
    listed = client.get("/v1/batches", params={"job": "billing"}, headers=auth).json()
    assert [b["batch_id"] for b in listed] == ["2026-11-21"]
    detail = client.get("/v1/batches/billing/2026-11-21", headers=auth).json()
    assert detail["marker"]["effects_new"] == 2 and detail["marker"]["rejects"] == 1
    assert detail["live"] == {
        "pending": 2,
        "leased": 0,
        "delivered": 0,
        "dead": 0,
        "cancelled": 0,
        "uncertain": 0,
        "expired": 0,
        "rejects": 0,
    }
    assert client.get("/v1/batches/billing/nope", headers=auth).status_code == 404


def test_a_batchs_live_counts_include_its_uncertain_effects(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    # The count came from the database but the response model had no field for it.
    story(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'uncertain', send_started_at = now()"
                " WHERE id = (SELECT min(id) FROM effects"
                " WHERE job = 'billing' AND batch_id = '2026-11-21')"
            )
        )
    detail = client.get("/v1/batches/billing/2026-11-21", headers=api_tokens.auth("support"))
    assert detail.json()["live"]["uncertain"] == 1 and detail.json()["live"]["pending"] == 1


def test_the_cursor_round_trips_time_and_id() -> None:
    """The cursor carries the id too, so rows sharing created_at page without gaps
    (test_search_by_recipient_pages_with_an_opaque_cursor pages through such rows)."""
    from spark_outbox.console.filters import Cursor

    at = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    assert Cursor.decode(Cursor(at, 42).encode()) == Cursor(at, 42)


def test_a_purged_key_still_answers_when_it_was_delivered(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    key = "c" * 64
    with engine.begin() as conn:
        conn.execute(
            sa.insert(key_ledger).values(
                idempotency_key=key,
                endpoint="billing-webhook",
                payload_sha256="0" * 64,
                delivered_at=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
            )
        )
    response = client.get(f"/v1/effects/{key}", headers=api_tokens.auth("support"))
    assert response.status_code == 404
    assert "delivered to billing-webhook at 2026-01-02" in response.json()["detail"]


def test_csv_cells_cannot_smuggle_spreadsheet_formulas(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    recipients = ['=HYPERLINK("http://evil")', " \t=1+1", "＠SUM(A1)", "bob@example.com"]
    with engine.begin() as conn:
        for n, recipient in enumerate(recipients):
            add_effect(conn, f"formula-{n}", recipient=recipient)
    response = client.get(
        "/v1/effects.csv",
        params={"endpoint": "billing-webhook", **window()},
        headers=api_tokens.auth("support"),
    )
    cells = {row["recipient"] for row in csv.DictReader(io.StringIO(response.text))}
    assert cells == {'\'=HYPERLINK("http://evil")', "' \t=1+1", "'＠SUM(A1)", "bob@example.com"}


# Every character whose NFKC form starts with = + - @ (full-width, small, super- and
# subscript forms, ⩵ ⩶, the Hebrew alternative plus), written out as the specification.
FORMULA_SIGNS = "=+-@⁺⁼₊₌⩵⩶﬩﹢﹣﹦﹫＋－＝＠"
# What a spreadsheet skips before it looks for a sign: whitespace, controls, format chars.
LEADING = st.text(st.sampled_from(" \t\r\n\x0b\x0c\x1f\u00a0\u2003\u3000\u200b\ufeff"), max_size=4)


def _through_csv(cell: str) -> str:
    """The cell as a spreadsheet would import it from the export."""
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerow([spreadsheet_safe(cell)])
    (row,) = csv.reader(io.StringIO(buffer.getvalue(), newline=""))
    return row[0]


@given(LEADING, st.sampled_from(FORMULA_SIGNS), st.text(max_size=20))
def test_a_cell_a_spreadsheet_would_evaluate_is_quoted(lead: str, sign: str, rest: str) -> None:
    cell = lead + sign + rest
    assert _through_csv(cell) == "'" + cell


@given(st.text(max_size=30))
def test_other_cells_pass_unchanged(text: str) -> None:
    head = text.lstrip(" \t\r\n\x0b\x0c\x1c\x1d\x1e\x1f\x85\u00a0\u2000\u3000")
    assume(not text.startswith(("\t", "\r")))
    assume(all(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in head[:1]))
    assume(not head.startswith(tuple(FORMULA_SIGNS)))
    assert _through_csv(text) == text


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=60)
OFFSETS = st.builds(
    dt.timezone,
    st.timedeltas(min_value=dt.timedelta(hours=-23.9), max_value=dt.timedelta(hours=23.9)),
)
IDS = st.integers() | st.sampled_from([0, -1, 2**63 - 1, 2**63, 10**30])
# Arbitrary strings, and strings that get past base64 into the time and id parsing.
CURSORS = (
    TEXT
    | st.builds(lambda at, ident: _b64(f"{at}|{ident}"), TEXT, TEXT)
    | st.builds(lambda at, ident: _b64(f"{at.isoformat()}|{ident}"), st.datetimes(), IDS)
    | st.builds(
        lambda at, ident: _b64(f"{at.isoformat()}|{ident}"), st.datetimes(timezones=OFFSETS), IDS
    )
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(cursor=CURSORS)
def test_any_cursor_is_a_page_or_a_422_never_a_500(
    client: TestClient, api_tokens: Tokens, cursor: str
) -> None:
    auth = api_tokens.auth("support")
    params = {"recipient": "bob@example.com", "cursor": cursor, **window()}
    page = client.get("/v1/effects", params=params, headers=auth)
    assert page.status_code in (200, 422), (cursor, page.text)
    if page.status_code == 422:
        assert page.json()["detail"][0]["loc"][-1] == "cursor"
    export = client.get("/v1/effects.csv", params=params, headers=auth)
    assert export.status_code in (200, 422), (cursor, export.text)


def test_a_window_in_an_offset_postgresql_refuses_is_answered_not_a_500(
    client: TestClient, api_tokens: Tokens
) -> None:
    """ISO 8601 and Python take +16:00, PostgreSQL does not: the filter hands it UTC
    (the contract test found the 500 once a dead-letter search needed no 31-day cap)."""
    window = {"since": "1999-01-01T00:00:00Z", "until": "2000-01-01T00:00:00+16:00"}
    auth = api_tokens.auth("operator")
    page = client.get("/v1/effects", params={"state": "dead", **window}, headers=auth)
    assert page.status_code == 200 and page.json()["items"] == []
    body = {"reason": "r", **window}
    assert client.post("/v1/effects/bulk-requeue", json=body, headers=auth).status_code == 200


def test_beside_a_backlog_status_and_metrics_read_the_queues_last_full_count(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    """Beyond queue.EXACT_UP_TO due effects the figures are the last full count's
    (migration 2813), shown with its time, until it is too old to use."""
    insert = sa.text(
        "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
        " next_attempt_at) SELECT lpad(to_hex(g), 64, '0'), 'billing-webhook', '{}', 'x',"
        " now() - interval '1 minute' FROM generate_series(:lo, :hi) g"
    )
    n = queue.EXACT_UP_TO + 5
    with engine.begin() as conn:
        conn.execute(insert, {"lo": 1, "hi": n})
    auth = api_tokens.auth("support")
    first = client.get("/v1/status", headers=auth).json()
    assert first["queue"]["depth"] == n and first["queue"]["as_of"] is not None
    hooks = {e["name"]: e for e in first["endpoints"]}
    assert hooks["billing-webhook"]["due_now"] == n
    with engine.begin() as conn:
        conn.execute(insert, {"lo": n + 1, "hi": n + 7})
    kept = client.get("/v1/status", headers=auth).json()["queue"]
    assert (kept["depth"], kept["as_of"]) == (n, first["queue"]["as_of"])
    assert f"outbox_queue_depth {float(n)}" in client.get("/metrics").text
    with engine.begin() as conn:  # older than any reader may use
        conn.execute(sa.text("UPDATE queue_snapshot SET taken_at = now() - interval '1 minute'"))
    counted = client.get("/v1/status", headers=auth).json()["queue"]
    assert counted["depth"] == n + 7 and counted["as_of"] != first["queue"]["as_of"]
