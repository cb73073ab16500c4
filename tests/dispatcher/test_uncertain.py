"""Uncertain instead of blind resend (docs/dispatcher.md, "Uncertain sends"): real
SMTP (aiosmtpd) and HTTP servers on loopback, real dispatcher processes, kill -9."""

from __future__ import annotations

import asyncio
import dataclasses
import email
import email.policy
import ipaddress
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_email, add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from tests.dispatcher import procs
from tests.dispatcher.conftest import run_worker


class Mailbox:
    """An SMTP handler that keeps every message it receives, then answers as told:
    'ok' (250), 'stall' (silence for ``stall_s``), 'drop' (closes without a reply)."""

    def __init__(self) -> None:
        self.message_ids: list[str] = []
        self.texts: list[str] = []
        self.modes: list[str] = ["ok"]  # the last one repeats
        self.stall_s = 30.0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.message_ids.append(str(msg["Message-ID"]))
        self.texts.append(msg.get_body(("plain",)).get_content())  # type: ignore[union-attr]
        mode = self.modes.pop(0) if len(self.modes) > 1 else self.modes[0]
        if mode == "stall":
            await asyncio.sleep(self.stall_s)
        elif mode == "drop":
            server.transport.close()
        return "250 Message accepted"


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


class DroppingHttp:
    """A raw HTTP/1.1 server: reads each whole request, keeps it, then answers 200 or
    closes the connection without a status line ('drop'), as scripted."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.modes: list[str] = ["ok"]
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.bodies.append(body)
            mode = self.modes.pop(0) if len(self.modes) > 1 else self.modes[0]
            if mode == "ok":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def http() -> Iterator[DroppingHttp]:
    server = DroppingHttp()
    yield server
    server.close()


def _mail_endpoint(engine: Engine, port: int, name: str = "mail", **kw: Any) -> None:
    with engine.begin() as conn:
        add_email(
            conn,
            name=name,
            smtp_host="127.0.0.1",
            smtp_port=port,
            mail_from="billing@example.com",
            **kw,
        )


def _mails(engine: Engine, n: int, endpoint: str = "mail") -> list[str]:
    keys = []
    with engine.begin() as conn:
        for i in range(n):
            key = effect_key(endpoint, i)
            payload = {"subject": f"Invoice {i}", "text": "Hi"}
            enqueue(
                conn,
                idempotency_key=key,
                endpoint=endpoint,
                payload=payload,
                recipient=f"c{i}@example.com",
            )
            keys.append(key)
    return keys


def _effect(engine: Engine, key: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT state, send_started_at, last_error, attempt_count FROM effects"
                " WHERE idempotency_key = :k"
            ),
            {"k": key},
        ).one()
    return dict(row._mapping)


def _attempts(engine: Engine, key: str) -> list[tuple[str, str | None, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.outcome, a.error_class, a.worker_id FROM delivery_attempts a"
                " JOIN effects e ON e.id = a.effect_id WHERE e.idempotency_key = :k"
                " ORDER BY a.id"
            ),
            {"k": key},
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_outbox", *args],
        cwd=procs.ROOT,
        env=procs.worker_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kill_9_mid_send_leaves_the_email_uncertain_never_resent_until_an_operator_says(
    engine: Engine, db_url: str, mailbox: tuple[Mailbox, int], tmp_path: Path
) -> None:
    box, port = mailbox
    box.modes = ["stall", "ok"]  # the first DATA is never answered
    _mail_endpoint(engine, port)
    (key,) = _mails(engine, 1)
    env = procs.worker_env(db_url, OUTBOX_LEASE_S="2")
    victim = procs.start(env | {"OUTBOX_WORKER_ID": "victim"})
    procs.wait_for(lambda: len(box.message_ids) == 1, 30, "the server to receive the message")
    victim.kill()  # kill -9 between the DATA terminator and the 250
    victim.wait(10)
    before = _effect(engine, key)
    assert before["state"] == "leased" and before["send_started_at"] is not None

    log = tmp_path / "rescuer.log"
    rescuer = procs.start(env | {"OUTBOX_WORKER_ID": "rescuer"}, log=log)
    try:
        procs.wait_for(lambda: _effect(engine, key)["state"] == "uncertain", 20, "uncertain")
        time.sleep(1.0)  # a live dispatcher that would resend has had its chance
        assert box.message_ids == [f"<{key}@spark-outbox>"]  # exactly one, never resent
        after = _effect(engine, key)
        assert "stopped mid-send" in after["last_error"]
        assert _attempts(engine, key) == [("uncertain", "LeaseExpired", "victim")]

        done = _cli(db_url, "effects", "resolve", key, "--send-again", "--reason", "no mail")
        assert done.returncode == 0, done.stderr
        procs.wait_for(lambda: _effect(engine, key)["state"] == "delivered", 20, "sent again")
    finally:
        assert procs.stop(rescuer) == 0, log.read_text()[-3000:]
    assert box.message_ids == [f"<{key}@spark-outbox>"] * 2  # sent once more, on request
    assert [a[0] for a in _attempts(engine, key)] == ["uncertain", "delivered"]
    with engine.connect() as conn:
        action = conn.execute(
            sa.text("SELECT action, target, reason, actor FROM operator_actions")
        ).one()
    assert tuple(action)[:3] == ("send_again", key, "no mail")
    assert action[3].startswith("cli:")


def test_a_connection_dropped_after_data_is_uncertain_and_mark_delivered_sends_nothing(
    engine: Engine, db_url: str, fast: Settings, mailbox: tuple[Mailbox, int]
) -> None:
    box, port = mailbox
    box.modes = ["drop"]
    _mail_endpoint(engine, port)
    marked, dry = _mails(engine, 2)
    assert run_worker(fast, engine) == 0
    assert len(box.message_ids) == 2  # each handed over once
    for key in (marked, dry):
        effect = _effect(engine, key)
        assert effect["state"] == "uncertain" and effect["send_started_at"] is not None
        assert effect["last_error"].startswith("handed over, then no answer")
        assert [a[0] for a in _attempts(engine, key)] == ["uncertain"]

    trial = _cli(
        db_url, "effects", "resolve", dry, "--mark-delivered", "--reason", "x", "--dry-run"
    )
    assert trial.returncode == 0 and "dry run: 1" in trial.stdout, trial.stderr
    assert _effect(engine, dry)["state"] == "uncertain"
    done = _cli(db_url, "effects", "resolve", marked, "--mark-delivered", "--reason", "got it")
    assert done.returncode == 0, done.stderr
    again = _cli(db_url, "effects", "resolve", marked, "--send-again", "--reason", "late")
    assert again.returncode == 2 and "is delivered; only an uncertain" in again.stderr

    box.modes = ["ok"]
    assert run_worker(fast, engine) == 0
    assert len(box.message_ids) == 2  # mark-delivered sent nothing; the other waits
    assert _effect(engine, marked)["state"] == "delivered"
    assert _effect(engine, dry)["state"] == "uncertain"
    with engine.connect() as conn:
        ledger = conn.execute(
            sa.text("SELECT state FROM key_ledger WHERE idempotency_key = :k"), {"k": marked}
        ).scalar_one()
    assert ledger == "delivered"


def test_a_deduplicating_email_endpoint_is_retried_after_a_drop_as_before(
    engine: Engine, fast: Settings, mailbox: tuple[Mailbox, int]
) -> None:
    box, port = mailbox
    box.modes = ["drop", "ok"]
    _mail_endpoint(engine, port, deduplicates=True)
    (key,) = _mails(engine, 1)
    assert run_worker(fast, engine) == 0
    assert box.message_ids == [f"<{key}@spark-outbox>"] * 2  # the same Message-ID
    assert _effect(engine, key)["state"] == "delivered"
    assert _effect(engine, key)["send_started_at"] is None  # no start recorded for it
    assert [a[0] for a in _attempts(engine, key)] == ["retry", "delivered"]


@pytest.mark.parametrize(
    ("deduplicates", "outcomes"), [(False, ["uncertain"]), (True, ["retry", "delivered"])]
)
def test_a_webhook_dropped_after_the_request_is_uncertain_unless_it_deduplicates(
    engine: Engine,
    fast: Settings,
    http: DroppingHttp,
    deduplicates: bool,
    outcomes: list[str],
) -> None:
    http.modes = ["drop", "ok"]
    with engine.begin() as conn:
        add_webhook(
            conn, name="hook", url=f"http://127.0.0.1:{http.port}/h", deduplicates=deduplicates
        )
    (key,) = procs.enqueue_many(engine, 1)
    settings = dataclasses.replace(fast, ssrf_allow_networks=(ipaddress.ip_network("127.0.0.0/8"),))
    assert run_worker(settings, engine) == 0
    assert [a[0] for a in _attempts(engine, key)] == outcomes
    assert len(http.bodies) == len(outcomes)  # received each time
    assert _effect(engine, key)["state"] == ("delivered" if deduplicates else "uncertain")


def test_an_expired_lease_without_a_started_send_is_reclaimed_not_uncertain(
    engine: Engine, mailbox: tuple[Mailbox, int]
) -> None:
    """The dispatcher died before start_sends: nothing went out, so it is sent as usual."""
    _, port = mailbox
    _mail_endpoint(engine, port)
    unstarted, started = _mails(engine, 2)
    claimed = {c.idempotency_key: c for c in store.claim(engine, "dead-worker", 10, 0.2)}
    ours = store.start_sends(engine, [(claimed[started].id, claimed[started].lease_token)])
    assert ours == {claimed[started].id}
    # A lease that is no longer ours cannot record a start (the send is not made).
    assert (
        store.start_sends(
            engine, [(claimed[unstarted].id, "0" * 8 + "-0000-4000-8000-" + "0" * 12)]
        )
        == set()
    )
    time.sleep(0.3)  # both leases expire
    again = store.claim(engine, "rescuer", 10, 5.0)
    assert [c.idempotency_key for c in again] == [unstarted]  # the started one is not offered
    assert store.settle_uncertain(engine) == [(started, "mail")]
    assert _effect(engine, started)["state"] == "uncertain"
    assert _effect(engine, unstarted)["state"] == "leased"
    assert store.settle_uncertain(engine) == []  # nothing more to settle


def test_lines_starting_with_a_dot_arrive_intact_through_the_driven_data_phase(
    engine: Engine, fast: Settings, mailbox: tuple[Mailbox, int]
) -> None:
    box, port = mailbox
    _mail_endpoint(engine, port)
    text = ".hidden\n..two\n.\nend"
    with engine.begin() as conn:
        enqueue(
            conn,
            idempotency_key=effect_key("mail", "dots"),
            endpoint="mail",
            payload={"subject": "dots", "text": text},
            recipient="d@example.com",
        )
    assert run_worker(fast, engine) == 0
    assert [t.replace("\r\n", "\n").rstrip("\n") for t in box.texts] == [text]
