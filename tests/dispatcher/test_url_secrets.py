"""The dispatcher's own error about an endpoint URL names the URL masked (its path
may hold the receiver's secret), for every role: the text is stored in the
attempt and the effect's ``last_error``, which support reads."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import run_worker

SECRET = "XXXXSECRETxxxx0123456789"


def test_an_invalid_url_error_does_not_repeat_the_urls_secret(
    engine: Engine, fast: Settings
) -> None:
    insert_endpoint(engine, "broken", url=f"http://127.0.0.1:99999/services/T000/B000/{SECRET}")
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=effect_key("u", 1), endpoint="broken", payload={"n": 1})
    assert run_worker(fast, engine) == 0
    with engine.connect() as conn:
        texts = (
            conn.execute(
                sa.text(
                    "SELECT error FROM delivery_attempts UNION ALL SELECT last_error FROM effects"
                )
            )
            .scalars()
            .all()
        )
    assert texts and all(t and "Port out of range" in t for t in texts), texts
    for text in texts:
        assert SECRET not in text and "T000" not in text
        assert "http://127.0.0.1:99999/services/***/***/***" in text
