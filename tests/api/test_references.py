"""Business references: enqueue checks them; the API search, the CSV, the pages and the
support page's one search box find and show effects by them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.keys import effect_key
from spark_outbox.core.validation import MAX_REFERENCE_CHARS
from tests.api.builders import add_batch
from tests.api.conftest import Tokens, window


def _enqueue(engine: Engine, name: str, reference: object, **kw: object) -> None:
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=effect_key("ref", name),
            endpoint="billing-webhook",
            payload={"n": name},
            reference=reference,  # type: ignore[arg-type]
            **kw,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("reference", "problem"),
    [("x" * (MAX_REFERENCE_CHARS + 1), "over"), ("INV\x001", "NUL"), (42, "int")],
)
def test_enqueue_refuses_a_bad_reference_naming_the_field(
    client: TestClient, engine: Engine, reference: object, problem: str
) -> None:
    with pytest.raises(InvalidEffect, match=problem) as info:
        _enqueue(engine, "bad", reference)
    assert info.value.field == "reference"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM effects")).scalar() == 0


def test_search_csv_and_pages_find_and_show_a_reference(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    _enqueue(engine, "a", "INV-2026/0042", recipient="dora@example.com")
    _enqueue(engine, "b", "INV-2026/0043", recipient="dora@example.com")
    auth = api_tokens.auth("support")
    params = {"reference": "INV-2026/0042", **window()}
    (found,) = client.get("/v1/effects", params=params, headers=auth).json()["items"]
    assert found["reference"] == "INV-2026/0042"
    assert found["idempotency_key"] == effect_key("ref", "a")
    csv = client.get("/v1/effects.csv", params=params, headers=auth).text.splitlines()
    assert "reference" in csv[0].split(",") and "INV-2026/0042" in csv[1]
    client.cookies.set("outbox_session", api_tokens.support)
    page = client.get(f"/ui/effects/{found['idempotency_key']}").text
    assert '<td id="effect-reference">INV-2026/0042</td>' in page


def test_the_search_box_tries_key_batch_reference_then_recipient(
    client: TestClient, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        add_batch(conn, "billing", "2026-11", [{"name": "b1", "reference": "billing/2026-11"}])
    _enqueue(engine, "r", "ACME-7", recipient="ACME-8")
    _enqueue(engine, "s", None, recipient="ACME-7")
    client.cookies.set("outbox_session", api_tokens.support)
    # A batch wins over a reference that looks like it.
    by_batch = client.get("/ui/search", params={"q": "billing/2026-11"})
    assert by_batch.url.path == "/ui/batch"
    # A reference wins over a recipient with the same text.
    by_reference = client.get("/ui/search", params={"q": "ACME-7"}).text
    assert "Matched by reference" in by_reference
    assert effect_key("ref", "r")[:16] in by_reference
    assert effect_key("ref", "s")[:16] not in by_reference
    by_recipient = client.get("/ui/search", params={"q": "ACME-8"}).text
    assert "Matched by recipient" in by_recipient and effect_key("ref", "r")[:16] in by_recipient
    assert "1. an idempotency key" in by_recipient  # the page says the order
