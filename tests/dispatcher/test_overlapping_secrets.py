"""Several overlapping signing secrets: a second rotation inside an overlap keeps every
unexpired secret signing. A real worker signs real deliveries to a loopback receiver,
which verifies them with the `standardwebhooks` package."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from spark_outbox.console import admin
from spark_outbox.core import endpoints
from spark_outbox.core.errors import Conflict
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from spark_outbox.dispatch.channels.webhook import WebhookChannel
from tests.dispatcher.conftest import Receiver, run_worker
from tests.dispatcher.test_rotation import _enqueue, _hook
from tests.test_lifecycle_cli import _cli


def _rotate(engine: Engine, overlap_s: float) -> str:
    with engine.begin() as conn:
        return admin.rotate_secret(
            conn, "hook", overlap_s=overlap_s, actor="olga", reason="rotation"
        ).signing_secret


def test_after_two_rotations_inside_the_overlap_a_receiver_holding_any_of_them_accepts(
    engine: Engine, fast: Settings, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    first = _hook(engine, receiver.url())
    caplog.set_level(logging.DEBUG)
    second = _rotate(engine, 3600)
    third = _rotate(engine, 3600)  # inside the first rotation's overlap
    _enqueue(engine, "twice")
    assert run_worker(fast, engine) == 0
    (req,) = receiver.seen()
    assert len(req.headers["webhook-signature"].split(" ")) == 3
    # A receiver still on the first secret, one that took the second, one on the newest.
    for secret in (first, second, third):
        assert Webhook(secret).verify(req.body, req.headers) == {"n": "twice"}
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    with engine.connect() as conn:
        audit = conn.execute(sa.text("SELECT CAST(details AS text) FROM operator_actions")).all()
    for secret in (first, second, third):
        assert secret not in logged and secret not in str(audit)


def test_each_secret_stops_signing_when_its_own_overlap_ends(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    first = _hook(engine, receiver.url())
    second = _rotate(engine, 7200)
    third = _rotate(engine, 3600)
    with engine.begin() as conn:  # the first secret's overlap has run out
        conn.execute(sa.text("UPDATE endpoint_secrets SET not_after = now() - interval '1 s'"))
        shown = endpoints.get(conn, "hook").public()
    assert len(shown["overlapping_secrets_until"]) == 1  # the second's, 2 h away
    assert not any(s in str(shown) for s in (first, second, third))
    _enqueue(engine, "later")
    assert run_worker(fast, engine) == 0
    (req,) = receiver.seen()
    for secret in (second, third):
        assert Webhook(secret).verify(req.body, req.headers) == {"n": "later"}
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(first).verify(req.body, req.headers)


def test_a_rotation_without_overlap_stops_every_earlier_secret_at_once(engine: Engine) -> None:
    first = _hook(engine, "https://example.com/h")
    second = _rotate(engine, 3600)
    third = _rotate(engine, 3600)
    fourth = _rotate(engine, 0)  # e.g. a leak
    with engine.connect() as conn:
        ep = endpoints.get(conn, "hook")
        kept = conn.execute(sa.text("SELECT count(*) FROM endpoint_secrets")).scalar()
    assert ep.active_secrets() == [fourth] and kept == 0
    assert first != second != third


def test_rotations_stop_at_ten_signing_secrets_with_the_way_out(engine: Engine) -> None:
    _hook(engine, "https://example.com/h")
    for _ in range(admin.MAX_SIGNING_SECRETS - 1):
        _rotate(engine, 3600)
    with pytest.raises(Conflict, match="overlap 0"):
        _rotate(engine, 3600)
    with engine.connect() as conn:
        assert len(endpoints.get(conn, "hook").active_secrets()) == admin.MAX_SIGNING_SECRETS
    _rotate(engine, 0)


def test_the_cli_rotates_to_a_secret_read_from_stdin_or_env_and_never_prints_it(
    db_url: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hook(engine, "https://example.com/h")
    mine, other = endpoints.generate_signing_secret(), endpoints.generate_signing_secret()
    monkeypatch.setattr("sys.stdin", io.StringIO(mine + "\n"))
    assert _cli(db_url, "endpoints", "rotate-secret", "hook", "--secret-stdin") == 0
    monkeypatch.setenv("NEXT_SECRET", other)
    assert _cli(db_url, "endpoints", "rotate-secret", "hook", "--secret-env", "NEXT_SECRET") == 0
    out = capsys.readouterr().out
    assert mine not in out and other not in out and "replaced" in out
    with engine.connect() as conn:
        active = endpoints.get(conn, "hook").active_secrets()
    assert active[:2] == [other, mine] and len(active) == 3
    monkeypatch.setattr("sys.stdin", io.StringIO("whsec_short\n"))
    assert _cli(db_url, "endpoints", "rotate-secret", "hook", "--secret-stdin") == 2
    assert "signing_secret" in capsys.readouterr().err


def test_a_running_channel_stops_signing_with_a_secret_when_its_overlap_ends(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """The channel works out an endpoint's signing keys once and keeps them (webhook.py,
    ``_keys``): kept only until the soonest overlap ends, though the endpoint as loaded
    (the same object, as a dispatcher's cache holds it) has not changed."""
    old = _hook(engine, receiver.url())
    new = _rotate(engine, 5.0)  # room for a loaded machine before the first send
    for name in ("during", "after"):
        _enqueue(engine, name)
    with engine.connect() as conn:
        endpoint = endpoints.get(conn, "hook")
    claimed = {c.idempotency_key: c for c in store.claim(engine, "w", 10, 60.0)}

    async def send(name: str) -> str:
        return (await channel.send(endpoint, claimed[effect_key("t", name)], 5.0)).outcome

    async def both() -> list[str]:
        await channel.start()
        try:
            first = await send("during")
            time.sleep(max(0.0, overlap_ends - time.time()) + 0.1)  # past the overlap
            return [first, await send("after")]
        finally:
            await channel.close()

    channel = WebhookChannel(fast, 1)
    (overlap_ends,) = [until.timestamp() for until in endpoint.overlapping_until()]
    assert asyncio.run(both()) == ["delivered", "delivered"]
    during, after = receiver.seen()
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert Webhook(old).verify(during.body, during.headers) == {"n": "during"}
    assert after.headers["webhook-signature"].count("v1,") == 1
    assert Webhook(new).verify(after.body, after.headers) == {"n": "after"}
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(after.body, after.headers)
