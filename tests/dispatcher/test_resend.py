"""Resend on request end to end: a real worker, real PostgreSQL, real HTTP and SMTP
receivers on loopback. The receiver gets the same key again, the attempt is recorded
as the operator's resend, and every guarantee of an ordinary send still holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from standardwebhooks import Webhook

from spark_outbox.console import audit, resend, verify
from spark_outbox.core import endpoints
from spark_outbox.core.endpoints import add_webhook, generate_signing_secret
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.demo.procs import outbox_process
from tests.dispatcher.conftest import Receiver, Reply, run_worker
from tests.dispatcher.test_uncertain import Mailbox, _mail_endpoint, _mails, mailbox  # noqa: F401


def _hook(
    engine: Engine, url: str, n: int = 1, ordering_key: str | None = None, **endpoint: Any
) -> tuple[str, list[str]]:
    with engine.begin() as conn:
        _, secret = add_webhook(conn, name="hook", url=url, **endpoint)
        keys = [effect_key("resend", i) for i in range(n)]
        for i, key in enumerate(keys):
            payload = {"n": i, "kind": "invoice.created"}
            enqueue(
                conn,
                idempotency_key=key,
                endpoint="hook",
                payload=payload,
                ordering_key=ordering_key,
            )
    return secret, keys


def _resend(engine: Engine, key: str) -> int:
    with engine.begin() as conn:
        done = resend.resend(
            conn, key, actor="olga", reason="receiver restored a backup", dry_run=False
        )
    assert done.action_id is not None
    return done.action_id


def _attempts(engine: Engine, key: str) -> list[tuple[str, int | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.outcome, a.resend_action_id FROM delivery_attempts a"
                " JOIN effects e ON e.id = a.effect_id WHERE e.idempotency_key = :k ORDER BY a.id"
            ),
            {"k": key},
        )
        return [(r[0], r[1]) for r in rows]


def _one(engine: Engine, sql: str, **params: object) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).one()


def test_a_resent_effect_reaches_the_receiver_again_with_the_same_key_recorded_as_a_resend(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    secret, (key, other) = _hook(engine, receiver.url(), n=2)
    assert run_worker(fast, engine) == 0
    first_delivery = _one(
        engine, "SELECT delivered_at FROM effects WHERE idempotency_key = :k", k=key
    )[0]
    # The contrast: a delivered key made pending without a resend (by hand, as a bug
    # might) is settled by the claim from its own delivered_at, never sent.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'pending', next_attempt_at = now()"
                " WHERE idempotency_key = :k"
            ),
            {"k": other},
        )
    action_id = _resend(engine, key)

    assert run_worker(fast, engine) == 0
    sent = receiver.seen()
    ids = [r.headers["webhook-id"] for r in sent]
    # The first run sent both at once (in either order); the second, the resend only.
    assert sorted(ids[:2]) == sorted([key, other]) and ids[2:] == [key]
    first = sent[ids.index(key)]
    assert sent[2].body == first.body and sent[2].headers["idempotency-key"] == key
    assert Webhook(secret).verify(sent[2].body, sent[2].headers) == {
        "n": 0,
        "kind": "invoice.created",
    }
    assert _attempts(engine, key) == [("delivered", None), ("delivered", action_id)]
    assert _attempts(engine, other) == [("delivered", None)]
    assert _one(
        engine, "SELECT state, last_error FROM effects WHERE idempotency_key = :k", k=other
    ) == (
        "delivered",
        "already delivered (its delivered_at): not sent again",
    )
    # The effect says when it was delivered last; the attempts, each time.
    last_delivery = _one(
        engine, "SELECT delivered_at FROM effects WHERE idempotency_key = :k", k=key
    )[0]
    assert last_delivery > first_delivery
    with engine.connect() as conn:
        detail = audit.effect_detail(conn, key)
    assert detail.effect.state == "delivered" and detail.effect.attempt_count == 2
    assert [a.resend_by for a in detail.attempts] == [None, "olga"]
    assert detail.resend is not None and detail.resend.reason == "receiver restored a backup"
    assert detail.resend.action == "resend" and detail.resend.target == key
    # outbox verify: a delivered key sent again carries the operator's resend.
    with engine.connect() as conn:
        checked = verify.Checker(settle_s=0).run_until_current(conn)
    assert checked.ok and checked.checked["finished"] == 2


def test_a_resend_to_a_paused_endpoint_waits_for_its_resume(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _, (key,) = _hook(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    with engine.begin() as conn:
        endpoints.pause(conn, "hook", "receiver maintenance")
    with engine.begin() as conn:
        done = resend.resend(conn, key, actor="olga", reason="lost it", dry_run=False)
    assert done.paused == 1
    assert run_worker(fast, engine, idle_within_s=0.5) == 0
    assert len(receiver.seen()) == 1
    assert (
        _one(engine, "SELECT state FROM effects WHERE idempotency_key = :k", k=key)[0] == "pending"
    )
    with engine.begin() as conn:
        endpoints.resume(conn, "hook")
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [key, key]


def test_resends_count_against_the_endpoints_in_flight_limit(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """A resend is leased as any send is: with max_in_flight 1, never two at once."""
    _, keys = _hook(engine, receiver.url(), n=3, max_in_flight=1)
    assert run_worker(fast, engine) == 0
    receiver.script("/hook", Reply(delay_s=0.3))
    receiver.most_in_flight.clear()
    done = _bulk(engine)
    assert done.resent == 3
    assert run_worker(fast, engine) == 0
    assert sorted(receiver.keys()[3:]) == sorted(keys)
    assert receiver.most_in_flight["/hook"] == 1
    with engine.connect() as conn:
        in_flight = conn.execute(sa.text("SELECT in_flight FROM endpoint_budgets")).scalar_one()
    assert in_flight == 0


def test_resends_on_an_ordered_endpoint_go_in_their_keys_order_and_hold_back_later_ones(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _, keys = _hook(engine, receiver.url(), n=3, ordering_key="customer-1", ordered=True)
    assert run_worker(fast, engine) == 0
    receiver.script("/hook", Reply(delay_s=0.1))
    done = _bulk(engine)
    later = effect_key("resend", "later")
    with engine.begin() as conn:
        payload = {"n": 9}
        enqueue(
            conn, idempotency_key=later, endpoint="hook", payload=payload, ordering_key="customer-1"
        )
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [*keys, *keys, later]
    for key in keys:
        assert _attempts(engine, key) == [("delivered", None), ("delivered", done.action_id)]


def _bulk(engine: Engine) -> resend.Resend:
    with engine.begin() as conn:
        return resend.bulk_resend(
            conn,
            _endpoint_filter(),
            cap=10,
            actor="olga",
            reason="receiver lost the morning",
            dry_run=False,
        )


def _endpoint_filter() -> Any:
    import datetime as dt

    from spark_outbox.console.filters import build_filter

    now = dt.datetime.now(dt.UTC)
    return build_filter(
        since=now - dt.timedelta(hours=1), until=now + dt.timedelta(hours=1), endpoint="hook"
    )


def test_a_resent_email_carries_the_same_message_id(
    engine: Engine,
    fast: Settings,
    mailbox: tuple[Mailbox, int],  # noqa: F811
) -> None:
    """E-mail cannot deduplicate: the resend goes through the started-send record as
    any send to it does, and the relay sees the same Message-ID again."""
    box, port = mailbox
    _mail_endpoint(engine, port)
    (key,) = _mails(engine, 1)
    assert run_worker(fast, engine) == 0
    action_id = _resend(engine, key)
    assert run_worker(fast, engine) == 0
    assert len(box.message_ids) == 2 and box.message_ids[0] == box.message_ids[1]
    assert key in box.message_ids[0]
    assert _attempts(engine, key) == [("delivered", None), ("delivered", action_id)]


def test_the_reference_receiver_deduplicates_a_resend_it_already_has(
    engine: Engine, fast: Settings, tmp_path: Path
) -> None:
    """What docs/operations.md says a deduplicating receiver does: `outbox receiver
    serve` answers the resend 200, marked a duplicate, and processes the key once."""
    secret = generate_signing_secret()
    env = {"OUTBOX_RECEIVER_SECRET": secret}
    jsonl = str(tmp_path / "receipts.jsonl")
    with outbox_process("receiver", "serve", "--port", "0", "--jsonl", jsonl, env=env) as (_, info):
        with engine.begin() as conn:
            add_webhook(
                conn, name="hook", url=info["url"] + "/hooks/billing", signing_secret=secret
            )
            key = effect_key("resend", "reference")
            enqueue(conn, idempotency_key=key, endpoint="hook", payload={"invoice": "inv-1"})
        assert run_worker(fast, engine) == 0
        action_id = _resend(engine, key)
        assert run_worker(fast, engine) == 0
        stats = httpx.get(info["url"] + "/stats", timeout=5).json()
    assert (stats["raw"], stats["unique"]) == (2, 1)
    assert _attempts(engine, key) == [("delivered", None), ("delivered", action_id)]
    with engine.connect() as conn:
        excerpts = (
            conn.execute(sa.text("SELECT response_excerpt FROM delivery_attempts ORDER BY id"))
            .scalars()
            .all()
        )
    assert '"duplicate": false' in excerpts[0] and '"duplicate": true' in excerpts[1]
