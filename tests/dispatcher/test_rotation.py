"""Secret rotation with overlap, end to end: a real worker signs real deliveries, and a
receiver verifying with the `standardwebhooks` package accepts either secret during the
overlap and only the new one after it."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from standardwebhooks import Webhook

from spark_outbox.console import admin
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import Receiver, run_worker


def _hook(engine: Engine, url: str) -> str:
    with engine.begin() as conn:
        _, secret = admin.create_webhook(
            conn, actor="olga", reason="new receiver", name="hook", url=url
        )
    return secret


def _enqueue(engine: Engine, name: str) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=effect_key("t", name), endpoint="hook", payload={"n": name})


def test_during_the_overlap_a_receiver_holding_either_secret_accepts(
    engine: Engine, fast: Settings, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    old = _hook(engine, receiver.url())
    caplog.set_level(logging.DEBUG)
    with engine.begin() as conn:
        rotation = admin.rotate_secret(
            conn, "hook", overlap_s=3600, actor="olga", reason="yearly rotation"
        )
    new = rotation.signing_secret
    assert new != old and rotation.previous_valid_until is not None
    _enqueue(engine, "during")
    assert run_worker(fast, engine) == 0
    (req,) = receiver.seen()
    assert len(req.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # the receiver may not have switched yet, or already has
        assert Webhook(secret).verify(req.body, req.headers) == {"n": "during"}
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert old not in logged and new not in logged
    with engine.connect() as conn:
        action, details = conn.execute(
            sa.text("SELECT action, CAST(details AS text) FROM operator_actions ORDER BY id DESC")
        ).first()  # type: ignore[misc]
    assert action == "rotate_secret" and new not in details and old not in details


def test_after_the_overlap_only_the_new_secret_verifies(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    old = _hook(engine, receiver.url())
    with engine.begin() as conn:
        new = admin.rotate_secret(conn, "hook", overlap_s=3600, actor="o", reason="r")
        # The overlap has run out (as if an hour had passed).
        conn.execute(
            sa.text("UPDATE endpoints SET previous_secret_expires_at = now() - interval '1 s'")
        )
    _enqueue(engine, "after")
    assert run_worker(fast, engine) == 0
    (req,) = receiver.seen()
    assert Webhook(new.signing_secret).verify(req.body, req.headers) == {"n": "after"}
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(old).verify(req.body, req.headers)


def test_without_overlap_the_old_secret_stops_at_once(engine: Engine) -> None:
    _hook(engine, "https://example.com/h")
    with engine.begin() as conn:
        done = admin.rotate_secret(conn, "hook", overlap_s=0, actor="o", reason="leaked")
        row = conn.execute(
            sa.text("SELECT previous_signing_secret, signing_secret FROM endpoints")
        ).one()
    assert done.previous_valid_until is None
    assert row == (None, done.signing_secret)
