"""Finding old things, and the lists a support person walks: a key's printed start
finds its effect, references and recipients at any age, the overview's tiles lead to
lists (by endpoint, reasons grouped, paged with counts), held batches, a batch's
rejects with their reasons, and an uncertain effect with no next attempt."""

from __future__ import annotations

import csv
import io
import re
import uuid

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.schema import rejects
from tests.api.builders import PAN, Built, add_attempt, add_batch, add_effect, leaky
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in

OLD = "now() - interval '400 days'"


def _age(engine: Engine, key: str, sql_time: str = OLD) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE effects SET created_at = {sql_time} WHERE idempotency_key = :k"),
            {"k": key},
        )


def _keyed(engine: Engine, key: str, **kw: object) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint="billing-webhook", payload={"k": key}, **kw)


def test_a_keys_printed_start_finds_its_effect_at_any_age(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    one, twin_a, twin_b = "13dd1f9d44fa" + "0" * 52, "abcdef01" + "1" * 56, "abcdef01" + "2" * 56
    for key in (one, twin_a, twin_b):
        _keyed(engine, key)
        _age(engine, key)
    auth = api_tokens.auth("support")
    page = client.get("/v1/effects", params={"key_prefix": "13DD1F9D44FA…"}, headers=auth).json()
    assert [e["idempotency_key"] for e in page["items"]] == [one]
    both = client.get("/v1/effects", params={"key_prefix": "abcdef01..."}, headers=auth).json()
    assert {e["idempotency_key"] for e in both["items"]} == {twin_a, twin_b}
    short = client.get("/v1/effects", params={"key_prefix": "abcdef0"}, headers=auth)
    assert short.status_code == 422 and short.json()["detail"][0]["loc"][-1] == "key_prefix"
    assert "at least 8" in short.json()["detail"][0]["msg"]

    _sign_in(client, api_tokens.support)
    opened = client.get("/ui/search", params={"q": "13dd1f9d44fa…"}, follow_redirects=False)
    assert opened.headers["location"] == f"/ui/effects/{one}"
    listed = client.get("/ui/search", params={"q": "abcdef01"}).text
    assert "Matched by key prefix" in listed and twin_a[:16] in listed and twin_b[:16] in listed
    assert "Showing 1–2 of 2" in listed


def test_references_and_recipients_are_found_at_any_age_and_broad_searches_keep_a_window(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    key = "ee" * 32
    _keyed(engine, key, recipient="old@example.com", reference="INV-1999-0001")
    _age(engine, key)
    auth = api_tokens.auth("support")
    for params in ({"recipient": "old@example.com"}, {"reference": "INV-1999-0001"}):
        page = client.get("/v1/effects", params=params, headers=auth).json()
        assert [e["idempotency_key"] for e in page["items"]] == [key], params
        rows = list(
            csv.DictReader(
                io.StringIO(client.get("/v1/effects.csv", params=params, headers=auth).text)
            )
        )
        assert [r["idempotency_key"] for r in rows] == [key]
    broad = client.get("/v1/effects", params={"endpoint": "billing-webhook"}, headers=auth)
    assert broad.status_code == 422 and broad.json()["detail"][0]["loc"][-1] == "since"
    _sign_in(client, api_tokens.support)
    for q in ("INV-1999-0001", "old@example.com"):
        page = client.get("/ui/search", params={"q": q}).text
        assert key[:16] in page and "at any age" in page, q


def _dead(engine: Engine, n: int, endpoint: str, error: str, recipient: str) -> list[Built]:
    made = []
    with engine.begin() as conn:
        for i in range(n):
            payload = {"subject": "s", "text": "t"} if endpoint == "billing-email" else None
            effect = add_effect(
                conn,
                f"{endpoint}-{error}-{i}",
                endpoint=endpoint,
                recipient=recipient,
                payload=payload,
            )
            add_attempt(conn, effect, "dead", status_code=400, error=error)
            made.append(effect)
    return made


def test_the_dead_tile_leads_to_a_list_by_endpoint_with_reasons_grouped_and_pages_counted(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    _dead(engine, 150, "billing-webhook", "HTTP 400: invoice field missing", "a@example.com")
    _dead(engine, 20, "billing-webhook", "HTTP 400: unknown currency", "a@example.com")
    _dead(engine, 1, "billing-email", "550 mailbox unavailable", "b@example.com")
    _sign_in(client, api_tokens.support)
    home = client.get("/ui").text
    assert 'href="/ui/effects?state=dead"' in home and 'href="/ui/held"' in home

    first = client.get("/ui/effects", params={"state": "dead"}).text
    assert "At any age" in first and "Showing 1–100 of 171" in first
    by_endpoint = _table(first, "by-endpoint")
    assert by_endpoint == [["billing-webhook", "170"], ["billing-email", "1"]]
    assert _table(first, "reasons") == [
        ["150", "HTTP 400: invoice field missing"],
        ["20", "HTTP 400: unknown currency"],
        ["1", "550 mailbox unavailable"],
    ]
    assert len(_table(first, "list-effects")) == 100
    following = re.search(r'id="next-page" href="([^"]+)"', first)
    assert following is not None
    second = client.get(following.group(1).replace("&amp;", "&")).text
    assert "Showing 101–171 of 171" in second and len(_table(second, "list-effects")) == 71
    assert 'id="next-page"' not in second and 'id="first-page"' in second

    email = client.get("/ui/effects", params={"state": "dead", "endpoint": "billing-email"}).text
    assert "Dead effects of billing-email" in email and "Showing 1–1 of 1" in email
    delivered = client.get("/ui/effects", params={"state": "delivered"}).text
    assert "The last 31 days" in delivered and 'id="no-effects"' in delivered


def _table(page: str, table_id: str) -> list[list[str]]:
    body = page.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0].split("<tbody>", 1)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
        for r in rows
    ]


def test_the_held_tile_lists_held_batches_and_their_waiting_effects_by_endpoint(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        rows = [{"name": f"h-{i}"} for i in range(3)]
        add_batch(conn, "billing", "2026-11-27", rows, effects_new=3)
        conn.execute(
            sa.text("UPDATE batches SET hold_state = 'held', hold_reason = '3 new, usually 1'")
        )
    _sign_in(client, api_tokens.support)
    assert 'id="held-tile"' in client.get("/ui").text
    page = client.get("/ui/held").text
    assert _table(page, "held-list")[0][:2] == ["billing", "2026-11-27"]
    assert _table(page, "by-endpoint") == [["billing-webhook", "3"]]


def test_the_batch_page_lists_its_rejects_with_reasons_grouped_masked_and_paged(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        add_batch(conn, "billing", "2026-11-28", [{"name": "ok"}], rejects=130)
        for i in range(130):
            reason = (
                "recipient: is not one e-mail address; give one plain address"
                if i < 110
                else "card.pan 4111111111111111 is not allowed in a payload"
            )
            conn.execute(
                sa.insert(rejects).values(
                    job="billing",
                    batch_id="2026-11-28",
                    run_id=uuid.uuid4(),
                    reason=reason,
                    raw_row={"row": i, "card": {"pan": "4111111111111111"}},
                )
            )
    _sign_in(client, api_tokens.support)
    page = client.get("/ui/batch", params={"job": "billing", "batch_id": "2026-11-28"}).text
    reasons = _table(page, "reject-reasons")
    assert reasons[0] == ["110", "recipient: is not one e-mail address; give one plain address"]
    assert reasons[1][0] == "20" and "4111111111111111" not in page  # masked for support
    assert len(_table(page, "batch-rejects")) == 100 and 'id="more-rejects"' in page
    more = re.search(r'id="more-rejects" href="([^"]+)"', page)
    assert more is not None
    rest = client.get(more.group(1).replace("&amp;", "&")).text
    assert len(_table(rest, "batch-rejects")) == 30 and 'id="first-rejects"' in rest
    assert "Showing 1–1 of 1" in page
    _sign_in(client, api_tokens.operator)
    assert (
        "4111111111111111"
        in client.get("/ui/batch", params={"job": "billing", "batch_id": "2026-11-28"}).text
    )


def test_an_uncertain_effect_shows_no_next_attempt(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        effect = add_effect(conn, "unknown-outcome", recipient="u@example.com")
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'uncertain', next_attempt_at = now() + interval '1 h'"
                " WHERE id = :id"
            ),
            {"id": effect.id},
        )
    auth = api_tokens.auth("support")
    detail = client.get(f"/v1/effects/{effect.key}", headers=auth).json()
    assert detail["effect"]["state"] == "uncertain" and detail["effect"]["next_attempt_at"] is None
    page = client.get("/v1/effects", params={"state": "uncertain"}, headers=auth).json()
    assert [e["next_attempt_at"] for e in page["items"]] == [None]
    _sign_in(client, api_tokens.support)
    shown = client.get(f"/ui/effects/{effect.key}").text
    assert 'id="uncertain-note"' in shown and "next attempt" not in shown


def test_a_lists_grouped_reasons_and_errors_are_masked_for_support(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    effect = leaky(engine)
    with engine.begin() as conn:
        add_attempt(conn, effect, "dead", status_code=422, error=f"HTTP 422: card {PAN} declined")
    _sign_in(client, api_tokens.support)
    page = client.get("/ui/effects", params={"state": "dead"}).text
    assert _table(page, "reasons")[0][0] == "1" and PAN not in page
    assert "HTTP 422: card" in page
    _sign_in(client, api_tokens.operator)
    assert PAN in client.get("/ui/effects", params={"state": "dead"}).text
