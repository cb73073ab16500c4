"""Send-by times (``expires_at``): real PostgreSQL, a real worker, real HTTP and SMTP
receivers on loopback. After its send-by time an effect is never sent and ends
'expired' with the reason; nothing about it blocks, counts against or loses anything else."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core import endpoints as endpoint_registry
from spark_outbox.core.endpoints import add_email, add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from spark_outbox.dispatch.channels.smtp import EmailChannel
from spark_outbox.dispatch.channels.webhook import WebhookChannel
from tests.dispatcher.conftest import Receiver, Reply, run_worker
from tests.dispatcher.test_uncertain import Mailbox
from tests.invariants import assert_invariants

NOW = dt.datetime.now


def _in(seconds: float) -> dt.datetime:
    return NOW(dt.UTC) + dt.timedelta(seconds=seconds)


def _enqueue(engine: Engine, n: object, endpoint: str = "hook", **kw: object) -> str:
    key = effect_key("expiry", n)
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint=endpoint, payload={"n": n}, **kw)  # type: ignore[arg-type]
    return key


def _effect(engine: Engine, key: str) -> sa.Row[tuple[str, str | None, int]]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT state, last_error, attempt_count FROM effects WHERE idempotency_key = :k"
            ),
            {"k": key},
        ).one()


def test_an_effect_enqueued_past_its_send_by_time_is_never_sent_and_ends_expired_saying_so(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    late = _enqueue(engine, 1, expires_at=_in(-60))
    fresh = _enqueue(engine, 2, expires_at=_in(600))
    never = _enqueue(engine, 3)
    # The claim leaves it out, before any expiry pass has run.
    claimed = store.claim(engine, "probe", 10, 30.0)
    assert {c.idempotency_key for c in claimed} == {fresh, never}
    store.release(engine, [store.Release(c.id, c.lease_token) for c in claimed])
    assert run_worker(fast, engine) == 0
    assert sorted(receiver.keys()) == sorted([fresh, never])
    state, reason, attempts = _effect(engine, late)
    assert (state, attempts) == ("expired", 0)
    assert reason is not None and reason.startswith("not sent: its send-by time ")
    assert reason.endswith("had passed when it was enqueued")
    assert_invariants(engine)


def test_an_effect_retried_past_its_send_by_time_expires_naming_its_attempts_and_last_error(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/hook", Reply(503))
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url(), retry_schedule_s=[0, 0.2, 30, 30])
    key = _enqueue(engine, 1, expires_at=_in(1.5))
    assert run_worker(fast, engine, idle_within_s=0.5) == 0
    sent = len(receiver.keys())
    time.sleep(1.6)  # its send-by time passes while it waits for its third try (30 s)
    assert run_worker(fast, engine, idle_within_s=0.5) == 0
    state, reason, attempts = _effect(engine, key)
    assert state == "expired" and attempts == sent == 2
    assert (
        reason is not None
        and "passed before a retry, after 2 attempt(s) (last: HTTP 503)" in reason
    )
    with engine.connect() as conn:
        # An expiry is not a failure of the endpoint: its failing streak stays at the 503s.
        failures = conn.execute(
            sa.text("SELECT failures FROM endpoint_budgets WHERE endpoint = 'hook'")
        ).scalar_one()
    assert failures == 2


def test_an_expired_head_of_an_ordering_key_never_blocks_the_effects_behind_it(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url(), ordered=True)
    head = _enqueue(engine, "head", ordering_key="customer-1", expires_at=_in(-1))
    behind = [_enqueue(engine, n, ordering_key="customer-1") for n in range(3)]
    # The expiry pass (a running worker's, every poll interval; here once, so the
    # test does not hang on a worker that stops before its first pass) ends the head.
    assert store.expire_due(engine) == [(head, "hook")]
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == behind  # in order, the expired head left out
    assert _effect(engine, head).state == "expired"


def test_effects_of_a_held_batch_expire_while_held_and_a_release_sends_none_of_them(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    from spark_outbox.console import holds

    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
        run_id = conn.execute(sa.text("SELECT gen_random_uuid()")).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO batches (job, batch_id, run_id, hold_state, hold_reason) "
                "VALUES ('job', 'b1', :run, 'held', 'a test hold')"
            ),
            {"run": run_id},
        )
        for n, expires in ((1, _in(0.3)), (2, _in(600))):
            conn.execute(
                sa.text(
                    "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, "
                    "payload, payload_sha256, next_attempt_at, expires_at) VALUES "
                    "(:k, 'job', 'b1', :run, 'hook', '{}', 'x', 'infinity', :x)"
                ),
                {"k": effect_key("held", n), "run": run_id, "x": expires},
            )
    time.sleep(0.4)
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == []
    # The worker's pass runs every poll interval; a worker that found nothing due may
    # stop before its first one on a loaded machine: the pass itself, once more (a
    # no-op when the worker's already ran).
    store.expire_due(engine)
    assert _effect(engine, effect_key("held", 1)).last_error.endswith(  # type: ignore[union-attr]
        "passed while its batch was held"
    )
    with engine.begin() as conn:
        holds.release(conn, "job", "b1", actor="ops", reason="checked", dry_run=False)
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [effect_key("held", 2)]
    assert _effect(engine, effect_key("held", 1)).state == "expired"


def test_a_live_lease_is_left_to_its_worker_and_an_expired_one_expires_freeing_its_slot(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/h", max_in_flight=1)
    key = _enqueue(engine, 1, expires_at=_in(0.5))
    (claimed,) = store.claim(engine, "w1", 10, 1.0)
    time.sleep(0.6)  # past its send-by time, its lease (1 s) still running
    assert store.expire_due(engine) == []
    time.sleep(0.5)  # the lease ran out: nobody sent it
    assert store.expire_due(engine) == [(key, "hook")]
    with engine.connect() as conn:
        in_flight = conn.execute(
            sa.text("SELECT in_flight FROM endpoint_budgets WHERE endpoint = 'hook'")
        ).scalar_one()
    assert in_flight == 0
    # The worker that held it records nothing over it: its lease token is gone.
    late = store.Result(claimed.id, claimed.lease_token, 1, "delivered", NOW(dt.UTC), 1.0)
    assert store.record(engine, "w1", [late]) == {(claimed.id, claimed.lease_token): False}
    state, reason, _ = _effect(engine, key)
    assert state == "expired" and reason is not None
    assert reason.endswith(
        "passed while it was claimed for attempt 1, before a send was recorded (the endpoint's "
        "limits, slow answers ahead of it, or its dispatcher stopped)"
    ), reason


def test_an_effect_nobody_claimed_before_its_send_by_time_says_how_long_it_waited(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/h")
    key = _enqueue(engine, 1, expires_at=_in(1.2))
    time.sleep(1.3)  # no dispatcher runs
    assert store.expire_due(engine) == [(key, "hook")]
    _, reason, attempts = _effect(engine, key)
    assert attempts == 0 and reason is not None
    assert reason.endswith(
        "passed before its first attempt, 2 s after it was enqueued: no dispatcher claimed it "
        "in time (were dispatchers running? a backlog or the endpoint's limits ahead of it?)"
    ), reason


def test_a_started_send_whose_lease_ran_out_stays_uncertain_not_expired(engine: Engine) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="http://127.0.0.1:9/h", deduplicates=False)
    key = _enqueue(engine, 1, expires_at=_in(0.3))
    (claimed,) = store.claim(engine, "w1", 10, 0.5)
    assert store.start_sends(engine, [(claimed.id, claimed.lease_token)]) == {claimed.id}
    time.sleep(0.7)
    assert store.expire_due(engine) == []
    assert store.settle_uncertain(engine) == [(key, "hook")]
    assert _effect(engine, key).state == "uncertain"


def _claimed_late(engine: Engine, endpoint: str) -> store.Claimed:
    """A claimed effect whose send-by time came after the claim (as if it waited)."""
    (claimed,) = store.claim(engine, "w1", 1, 30.0)
    assert claimed.endpoint == endpoint and claimed.send_by is not None
    return dataclasses.replace(claimed, send_by=time.monotonic() - 0.001)


def test_a_webhook_whose_send_by_time_came_after_its_claim_is_not_written_to_the_receiver(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    _enqueue(engine, 1, expires_at=_in(600))
    claimed = _claimed_late(engine, "hook")
    with engine.connect() as conn:
        endpoint = endpoint_registry.get(conn, "hook")

    async def send() -> str:
        channel = WebhookChannel(fast, 1)
        await channel.start()
        try:
            return (await channel.send(endpoint, claimed, 5.0)).outcome
        finally:
            await channel.close()

    assert asyncio.run(send()) == "expired"
    time.sleep(0.2)
    assert receiver.seen() == []


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


def test_an_email_whose_send_by_time_came_after_its_claim_never_reaches_the_mail_server(
    engine: Engine, fast: Settings, mailbox: tuple[Mailbox, int]
) -> None:
    box, port = mailbox
    with engine.begin() as conn:
        add_email(conn, name="mail", smtp_host="127.0.0.1", smtp_port=port, mail_from="a@b.example")
    payload = {"subject": "Your code", "text": "123456"}
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=effect_key("mail", 1),
            endpoint="mail",
            payload=payload,
            recipient="ada@example.com",
            expires_at=_in(600),
        )
    claimed = _claimed_late(engine, "mail")
    with engine.connect() as conn:
        endpoint = endpoint_registry.get(conn, "mail")
    sent = asyncio.run(EmailChannel(fast).send(endpoint, claimed, 5.0))
    assert (sent.outcome, sent.handed_over) == ("expired", False)
    time.sleep(0.2)
    assert box.message_ids == []
