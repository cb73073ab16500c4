"""Webhook outcomes end to end: real worker, real PostgreSQL, real HTTP receiver."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from standardwebhooks import Webhook

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import Receiver, Reply, run_worker


def _setup(engine: Engine, url: str, n: int = 1, **endpoint: Any) -> tuple[str, list[str]]:
    with engine.begin() as conn:
        _, secret = add_webhook(conn, name="hook", url=url, **endpoint)
        keys = [effect_key("t", i) for i in range(n)]
        for i, key in enumerate(keys):
            enqueue(
                conn,
                idempotency_key=key,
                endpoint="hook",
                payload={"n": i, "kind": "invoice.created"},
            )
    return secret, keys


def _effect(engine: Engine, key: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(
            conn.execute(sa.text("SELECT * FROM effects WHERE idempotency_key = :k"), {"k": key})
            .mappings()
            .one()
        )


def _attempts(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM delivery_attempts ORDER BY id")).mappings()
        return [dict(r) for r in rows]


def test_success_is_delivered_signed_and_verifiable(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    secret, (key,) = _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    (req,) = receiver.seen()
    assert req.headers["webhook-id"] == key == req.headers["idempotency-key"]
    # A receiver using the standardwebhooks package from PyPI verifies the signature.
    assert Webhook(secret).verify(req.body, req.headers) == {"n": 0, "kind": "invoice.created"}
    row = _effect(engine, key)
    assert row["state"] == "delivered" and row["lease_token"] is None
    (attempt,) = _attempts(engine)
    assert attempt["outcome"] == "delivered" and attempt["status_code"] == 200
    assert attempt["worker_id"] == "test-worker" and attempt["duration_ms"] > 0


def test_500_then_success_is_retried_with_the_same_webhook_id(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/hook", Reply(500, body="boom"), 200)
    _, (key,) = _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [key, key]
    assert [a["outcome"] for a in _attempts(engine)] == ["retry", "delivered"]
    assert _attempts(engine)[0]["response_excerpt"].startswith("HTTP 500")
    assert _effect(engine, key)["attempt_count"] == 2


def test_429_retry_after_is_respected(engine: Engine, fast: Settings, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(429, headers={"Retry-After": "1"}), 200)
    _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    first, second = receiver.seen()
    # The schedule says 0.2 s (±20 %); the receiver asked for 1 s.
    assert second.at - first.at >= 0.95
    assert [a["outcome"] for a in _attempts(engine)] == ["retry", "delivered"]


def test_a_timeout_is_retried_then_dead_when_the_schedule_is_exhausted(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/hook", Reply(200, delay_s=2.0))
    _, (key,) = _setup(engine, receiver.url(), timeout_s=0.3)
    assert run_worker(fast, engine) == 0
    attempts = _attempts(engine)
    assert [a["outcome"] for a in attempts] == ["retry", "retry", "dead"]
    assert {a["error_class"] for a in attempts} == {"Timeout"}
    row = _effect(engine, key)
    assert row["state"] == "dead" and "retries exhausted after 3 attempts" in row["last_error"]


def test_410_kills_the_effect_and_pauses_the_endpoint(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/hook", 410)
    _, keys = _setup(engine, receiver.url(), n=3)
    assert run_worker(dataclasses.replace(fast, concurrency=1, claim_batch_size=1), engine) == 0
    # The first 410 pauses the endpoint: its other effects stay pending, unsent.
    assert len(receiver.seen()) == 1
    states = sorted(_effect(engine, k)["state"] for k in keys)
    assert states == ["dead", "pending", "pending"]
    with engine.connect() as conn:
        enabled, reason = conn.execute(
            sa.text("SELECT enabled, paused_reason FROM endpoints")
        ).one()
    assert enabled is False and "410" in reason
    assert _attempts(engine)[0]["outcome"] == "gone"
    # Handed back unsent: no attempt spent, due as soon as an operator resumes.
    for row in (_effect(engine, k) for k in keys):
        if row["state"] == "pending":
            assert row["attempt_count"] == 0 and row["lease_token"] is None
            assert row["next_attempt_at"] <= dt.datetime.now(dt.UTC)


def test_a_redirect_is_not_followed(engine: Engine, fast: Settings, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(302, headers={"Location": receiver.url("/elsewhere")}))
    _, (key,) = _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    assert [r.path for r in receiver.seen()] == ["/hook"]
    row = _effect(engine, key)
    assert row["state"] == "dead" and "redirect not followed" in row["last_error"]


def test_other_4xx_is_dead_with_the_reason_and_redacted_headers(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script(
        "/hook",
        Reply(400, headers={"Set-Cookie": "session=abc", "X-Signature": "s3cr3t"}, body="x" * 5000),
    )
    _, (key,) = _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    (attempt,) = _attempts(engine)
    assert attempt["outcome"] == "dead" and attempt["status_code"] == 400
    excerpt = attempt["response_excerpt"]
    assert "abc" not in excerpt and "s3cr3t" not in excerpt and "[redacted]" in excerpt
    assert len(excerpt.encode()) <= 2048
    assert _effect(engine, key)["state"] == "dead"


def test_only_harmless_headers_keep_their_values_in_the_excerpt(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """A receiver's own names for credentials (X-Session, X-Access) are unknowable
    to a deny-list: every header outside the allow-list appears by name with its
    value redacted; the ones support needs (request id, content type, server, date,
    retry-after) keep theirs."""
    receiver.script(
        "/hook",
        Reply(
            503,
            headers={
                "X-Session": "sess-123",
                "X-Access": "acc-456",
                "X-Request-Id": "req-789",
                "Retry-After": "1",
            },
            body="busy",
        ),
        Reply(200),
    )
    _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    excerpt = _attempts(engine)[0]["response_excerpt"]
    assert "sess-123" not in excerpt and "acc-456" not in excerpt
    lines = excerpt.splitlines()
    assert "X-Session: [redacted]" in lines and "X-Access: [redacted]" in lines
    assert "X-Request-Id: req-789" in lines and "Retry-After: 1" in lines
    assert "Content-Type: text/plain; charset=utf-8" in lines
    assert any(line.startswith("Server: Python/") for line in lines)
    assert any(line.startswith("Date: ") and "redacted" not in line for line in lines)


def test_a_connection_error_is_retried(engine: Engine, fast: Settings, receiver: Receiver) -> None:
    _, (key,) = _setup(engine, "http://127.0.0.1:9/closed")
    assert run_worker(fast, engine) == 0
    attempts = _attempts(engine)
    assert [a["outcome"] for a in attempts] == ["retry", "retry", "dead"]
    assert attempts[0]["error_class"] == "ConnectFailed"
    assert _effect(engine, key)["state"] == "dead"


def test_the_default_ssrf_guard_refuses_internal_addresses(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="loop", url=receiver.url())
        add_webhook(conn, name="meta", url="http://169.254.169.254/latest/meta-data")
        enqueue(conn, idempotency_key=effect_key("a", 1), endpoint="loop", payload={})
        enqueue(conn, idempotency_key=effect_key("a", 2), endpoint="meta", payload={})
    assert run_worker(dataclasses.replace(fast, ssrf_allow_networks=()), engine) == 0
    assert receiver.seen() == []
    attempts = _attempts(engine)
    assert {a["outcome"] for a in attempts} == {"dead"}
    errors = sorted(a["error"] for a in attempts)
    assert "127.0.0.1 is loopback" in errors[0]
    assert "169.254.169.254 is link-local" in errors[1]
    assert {a["error_class"] for a in attempts} == {"SsrfRefused"}


def test_a_delivered_key_is_never_sent_again(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _, (key,) = _setup(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    # Retention purges the effect; the same key is produced again.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM effects"))
        again = enqueue(conn, idempotency_key=key, endpoint="hook", payload={"n": 0})
    assert again.new is False
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [key]


def test_payload_bytes_sent_are_the_stored_json(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _setup(engine, receiver.url(), n=20)
    start = time.monotonic()
    assert run_worker(fast, engine) == 0
    assert time.monotonic() - start < 10
    bodies = sorted(json.loads(r.body)["n"] for r in receiver.seen())
    assert bodies == list(range(20))


def test_rate_limited_effects_never_wait_past_half_their_lease(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _, keys = _setup(engine, receiver.url(), n=6, rate_limit_per_s=4.0)
    short_lease = dataclasses.replace(fast, lease_s=1.0, concurrency=6)
    assert run_worker(short_lease, engine) == 0
    # Those that waited too long for a token were handed back, not sent late:
    # every key was sent exactly once and no attempt went unrecorded.
    assert sorted(receiver.keys()) == sorted(keys)
    with engine.connect() as conn:
        counted, logged = conn.execute(
            sa.text(
                "SELECT sum(attempt_count), (SELECT count(*) FROM delivery_attempts) FROM effects"
            )
        ).one()
    assert counted == logged == 6
    assert {_effect(engine, k)["state"] for k in keys} == {"delivered"}


def test_a_sender_that_crashes_stops_the_worker_with_a_non_zero_exit(
    engine: Engine, fast: Settings, receiver: Receiver, monkeypatch: Any
) -> None:
    """Senders catch every error of an attempt; one that dies anyway (a bug) must not
    leave the worker running with fewer senders in silence: it stops, exit 1."""
    from spark_outbox.dispatch.worker import Worker

    _setup(engine, receiver.url("/hook"), n=3)
    calls: list[int] = []

    def broken(self: Worker) -> None:
        calls.append(1)
        raise RuntimeError("a bug in the sender")

    monkeypatch.setattr(Worker, "_sent", broken)
    assert run_worker(fast, engine, timeout_s=20) == 1
    assert calls
