"""docs/api.md's curl examples, run as written against a served API: each answers what
its comment says (the old example's fixed window returned nothing for today's effects)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.schema import rejects
from tests import ROOT
from tests.api.builders import add_batch, add_effect
from tests.api.conftest import Served, Tokens

BLOCK = re.compile(r"<!-- api-example[^>]*-->\s*```sh\n(.*?)```", re.DOTALL)


def _documents(text: str) -> list[Any]:
    """curl prints the JSON bodies back to back."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


def test_the_api_docs_curl_examples_answer_what_they_say(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    with engine.begin() as conn:
        batch = add_batch(
            conn, "billing", "2026-01-01", [{"name": "c-1"}, {"name": "c-2", "recipient": "x@y.z"}]
        )
        alice = add_effect(conn, "order-1")  # recipient alice@example.com
        old = add_effect(conn, "order-0")  # ... two years ago
        conn.execute(
            sa.text("UPDATE effects SET created_at = now() - interval '2 years' WHERE id = :id"),
            {"id": old.id},
        )
        conn.execute(
            sa.insert(rejects).values(
                job="billing",
                batch_id="2026-01-01",
                run_id=uuid.uuid4(),
                reason="units: -3 is negative; fix the event",
                raw_row={"customer_id": "c-9", "units": -3},
            )
        )
    (block,) = BLOCK.findall((ROOT / "docs/api.md").read_text())
    script = block.replace("API=http://127.0.0.1:8000", f"API={served.url}")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, "TOKEN": api_tokens.support},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    by_batch, by_recipient, at_any_age, rejected = _documents(done.stdout)
    assert {e["idempotency_key"] for e in by_batch["items"]} == {b.key for b in batch}
    assert [e["idempotency_key"] for e in by_recipient["items"]] == [alice.key]
    assert [e["idempotency_key"] for e in at_any_age["items"]] == [alice.key, old.key]
    assert [r["reason"] for r in rejected["items"]] == ["units: -3 is negative; fix the event"]
