"""The crash window to endpoints that cannot deduplicate: a ``kill -9`` leaves
uncertain only what was really on the wire, and at most ``nondedup_concurrency``
of a worker's sends (real dispatcher processes, aiosmtpd, a real HTTP receiver)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_email, add_webhook
from spark_outbox.core.settings import Settings
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver


class SlowMailbox:
    """Keeps every message's Message-ID; stalls at RCPT or after DATA while told to."""

    def __init__(self) -> None:
        self.message_ids: list[str] = []
        self.stall_at: str | None = None  # 'rcpt' | 'data' | None
        self.rcpts = 0

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        self.rcpts += 1
        if self.stall_at == "rcpt":
            await asyncio.sleep(30)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.message_ids.append(str(msg["Message-ID"]))
        if self.stall_at == "data":
            await asyncio.sleep(30)
        return "250 Message accepted"


@pytest.fixture
def slow_mailbox() -> Iterator[tuple[SlowMailbox, int]]:
    box, port = SlowMailbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


def _mails(engine: Engine, port: int, n: int) -> None:
    with engine.begin() as conn:
        add_email(
            conn, name="mail", smtp_host="127.0.0.1", smtp_port=port, mail_from="b@example.com"
        )
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, recipient, payload,"
                " payload_sha256) SELECT lpad('m' || to_hex(g), 64, '0'), 'mail', 'c@example.com',"
                " jsonb_build_object('subject', 'Invoice', 'text', 'Hi'), 'x'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": n},
        )


def _count(engine: Engine, where: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM effects WHERE {where}")).scalar())


def _kill(victim: Any) -> None:
    victim.kill()
    victim.wait(10)


def test_a_dispatcher_killed_before_the_message_went_out_leaves_the_email_to_send_again(
    engine: Engine, db_url: str, slow_mailbox: tuple[SlowMailbox, int]
) -> None:
    """Connecting, MAIL and RCPT hand nothing over: the start is recorded only once
    DATA is accepted, so a kill before it is an ordinary crash (sent again), not an
    uncertain e-mail an operator must resolve."""
    box, port = slow_mailbox
    box.stall_at = "rcpt"
    _mails(engine, port, 1)
    env = procs.worker_env(db_url, OUTBOX_LEASE_S="2")
    victim = procs.start(env)
    try:
        procs.wait_for(lambda: box.rcpts == 1, 30, "the victim to reach RCPT")
    finally:
        _kill(victim)
    assert _count(engine, "state = 'leased' AND send_started_at IS NULL") == 1
    box.stall_at = None
    rescuer = procs.start(env)
    try:
        procs.wait_for(lambda: _count(engine, "state = 'delivered'") == 1, 30, "the resend")
    finally:
        assert procs.stop(rescuer) == 0
    assert _count(engine, "state = 'uncertain'") == 0
    assert len(box.message_ids) == 1


def test_a_kill_leaves_at_most_nondedup_concurrency_emails_uncertain_while_webhooks_flow(
    engine: Engine, db_url: str, slow_mailbox: tuple[SlowMailbox, int], receiver: Receiver
) -> None:
    """Every message stalls after its content: only the default 4 are ever on the
    wire at once (the other claimed e-mails wait in their endpoint's line, not in a
    sender), webhooks of another endpoint are all delivered meanwhile, and a kill
    leaves exactly those 4 uncertain; the rest are sent once each afterwards."""
    assert Settings().nondedup_concurrency == 4
    box, port = slow_mailbox
    box.stall_at = "data"
    _mails(engine, port, 20)
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    procs.enqueue_many(engine, 30, "hook")
    env = procs.worker_env(db_url, OUTBOX_LEASE_S="2")
    victim = procs.start(env)
    try:
        procs.wait_for(lambda: len(receiver.seen()) == 30, 30, "the webhooks")
        procs.wait_for(lambda: len(box.message_ids) == 4, 30, "four messages on the wire")
        procs.wait_for(lambda: _count(engine, "endpoint = 'hook' AND state = 'delivered'") == 30,
                       30, "the webhooks recorded")  # fmt: skip
        assert len(box.message_ids) == 4
    finally:
        _kill(victim)
    assert _count(engine, "send_started_at IS NOT NULL") == 4
    box.stall_at = None
    rescuer = procs.start(env)
    try:
        procs.wait_for(lambda: _count(engine, "state = 'delivered'") == 46, 30, "the rest")
        procs.wait_for(lambda: _count(engine, "state = 'uncertain'") == 4, 30, "uncertain")
    finally:
        assert procs.stop(rescuer) == 0
    assert len(box.message_ids) == len(set(box.message_ids)) == 20


def test_while_records_stall_a_worker_sends_no_more_than_it_may_lose(
    engine: Engine, db_url: str, receiver: Receiver
) -> None:
    """What a crash loses is what was sent and not yet recorded. With its records held
    up (the attempt log locked), a worker with 4 sends in flight and claims of 4 sends
    8 effects and then waits for its records; it kept claiming and sending before,
    every outcome held in memory only, all 40 here. Once the lock goes, every
    effect is recorded, each sent once."""
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    procs.enqueue_many(engine, 40, "hook")
    env = procs.worker_env(db_url, OUTBOX_CONCURRENCY="4", OUTBOX_CLAIM_BATCH_SIZE="4")
    worker = None
    try:
        with engine.connect() as blocker, blocker.begin():
            blocker.execute(sa.text("LOCK TABLE delivery_attempts IN SHARE MODE"))  # records wait
            worker = procs.start(env)
            procs.wait_for(lambda: len(receiver.seen()) >= 8, 30, "the first sends")
            time.sleep(2.0)  # a worker that went on would have sent them all by now
            assert len(receiver.seen()) == 8
        procs.wait_for(lambda: _count(engine, "state = 'delivered'") == 40, 30, "the records")
    finally:
        if worker is not None:
            assert procs.stop(worker) == 0
    keys = receiver.keys()
    assert len(keys) == len(set(keys)) == 40
