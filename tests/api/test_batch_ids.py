"""Every batch is addressable: ids with any characters ('/', '%', '?', '#', spaces,
unicode, dot segments) through every batch route and page of the real app, and the
batch page pages through its effects with URL-encoded links."""

from __future__ import annotations

import html
import re
import urllib.parse
import uuid

import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Connection, Engine

from spark_outbox.core.keys import effect_key
from tests.api.conftest import Tokens

JOB = "stream"
# Any text PostgreSQL can hold (no NUL, no surrogates), biased towards URL trouble.
BATCH_IDS = st.one_of(
    st.text(alphabet=st.sampled_from("/%?#&+=. ;é€😀\\\t"), min_size=1, max_size=12),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([".", "..", "a/../b", "q-1/2/3", "50%", "#1", "x?y=z", " lead", "/"]),
)


def _add(conn: Connection, batch_id: str, n: int) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO batches (job, batch_id, run_id, effects_total, effects_new) "
            "VALUES (:job, :b, :run, :n, :n)"
        ),
        {"job": JOB, "b": batch_id, "run": uuid.uuid4(), "n": n},
    )
    conn.execute(
        sa.text(
            "INSERT INTO effects (idempotency_key, job, batch_id, endpoint, payload, "
            "payload_sha256) SELECT encode(sha256(convert_to(:b || '#' || i, 'UTF8')), 'hex'), "
            ":job, :b, 'billing-webhook', jsonb_build_object('i', i), 'x' "
            "FROM generate_series(1, :n) i"
        ),
        {"job": JOB, "b": batch_id, "n": n},
    )


def _dot_segment(batch_id: str) -> bool:
    return any(part in (".", "..") for part in batch_id.split("/"))


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch_id=BATCH_IDS)
def test_any_batch_id_works_in_every_route_and_page(
    client: TestClient, api_tokens: Tokens, engine: Engine, batch_id: str
) -> None:
    with engine.begin() as conn:
        if (
            conn.execute(
                sa.text("SELECT 1 FROM batches WHERE job = :j AND batch_id = :b"),
                {"j": JOB, "b": batch_id},
            ).first()
            is None
        ):
            _add(conn, batch_id, 2)
    auth = api_tokens.auth("support")
    query = {"job": JOB, "batch_id": batch_id}
    by_query = client.get("/v1/batch", params=query, headers=auth)
    assert by_query.status_code == 200, by_query.text
    assert by_query.json()["marker"]["batch_id"] == batch_id
    if not _dot_segment(batch_id):  # clients drop dot segments from paths (RFC 3986)
        path = f"/v1/batches/{JOB}/{urllib.parse.quote(batch_id, safe='')}"
        by_path = client.get(path, headers=auth)
        assert by_path.status_code == 200, (path, by_path.text)
        assert by_path.json()["marker"]["batch_id"] == batch_id
    (recon,) = client.get("/v1/reconcile", params=query, headers=auth).json()
    assert recon["batch_id"] == batch_id and recon["unexplained"] == 0
    client.cookies.set("outbox_session", api_tokens.support)
    page = client.get("/ui/batch", params=query)
    assert page.status_code == 200
    shown = re.search(r'<span id="batch-id">(.*?)</span>', page.text, re.S)
    assert shown is not None and html.unescape(shown.group(1)) == batch_id
    if batch_id.strip() == batch_id:  # the box trims what a person typed
        found = client.get("/ui/search", params={"q": f"{JOB}/{batch_id}"})
        assert found.status_code == 200 and found.url.path == "/ui/batch"
        assert urllib.parse.parse_qs(found.url.query.decode())["batch_id"] == [batch_id]


def test_the_batch_page_pages_through_its_effects(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    batch_id = "stream-1/7 #a?b=%20"
    with engine.begin() as conn:
        _add(conn, batch_id, 150)
    client.cookies.set("outbox_session", api_tokens.support)
    first = client.get("/ui/batch", params={"job": JOB, "batch_id": batch_id})
    assert first.text.count('class="key"') == 100
    link = re.search(r'id="next-page" href="([^"]+)"', first.text)
    assert link is not None
    second = client.get(html.unescape(link.group(1)))
    assert second.status_code == 200 and second.text.count('class="key"') == 50
    assert 'id="next-page"' not in second.text and 'id="first-page"' in second.text
    keys = set(re.findall(r"/ui/effects/([0-9a-f]{64})", first.text + second.text))
    assert len(keys) == 150 and effect_key("x") not in keys
