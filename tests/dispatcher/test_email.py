"""E-mail effects through a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import email
import email.policy
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_email
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.logs import TextFormatter
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch.channels.smtp import message_id
from tests.dispatcher import procs
from tests.dispatcher.conftest import run_worker


class Inbox:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.refuse_with: str | None = None

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if self.refuse_with:
            return self.refuse_with
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(msg)  # type: ignore[arg-type]
        return "250 Message accepted"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def _mail(engine: Engine, port: int, *effects: tuple[str | None, dict[str, Any]]) -> list[str]:
    keys = []
    with engine.begin() as conn:
        add_email(
            conn,
            name="mail",
            smtp_host="127.0.0.1",
            smtp_port=port,
            mail_from="billing@example.com",
        )
        for i, (recipient, payload) in enumerate(effects):
            key = effect_key("mail", i)
            enqueue(
                conn, idempotency_key=key, endpoint="mail", payload=payload, recipient=recipient
            )
            keys.append(key)
    return keys


def _states(engine: Engine) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT idempotency_key, state, last_error FROM effects"))
        return {r[0]: (r[1], r[2]) for r in rows}


def test_an_email_is_delivered_with_a_message_id_from_the_key(
    engine: Engine, fast: Settings, smtp: tuple[Inbox, int]
) -> None:
    inbox, port = smtp
    (key,) = _mail(
        engine,
        port,
        ("ann@example.com", {"subject": "Invoice 7", "text": "Hi", "html": "<p>Hi</p>"}),
    )
    assert run_worker(fast, engine) == 0
    (msg,) = inbox.messages
    assert msg["Message-ID"] == message_id(key) == f"<{key}@spark-outbox>"
    assert msg["To"] == "ann@example.com" and msg["Subject"] == "Invoice 7"
    assert msg["From"] == "billing@example.com"
    assert msg.get_body(("plain",)).get_content().strip() == "Hi"  # type: ignore[union-attr]
    assert _states(engine)[key][0] == "delivered"


def test_missing_recipient_or_subject_is_a_dead_letter_not_a_crash(
    engine: Engine, fast: Settings, smtp: tuple[Inbox, int]
) -> None:
    """``enqueue`` refuses such effects up front; rows written another way (by hand,
    before that check existed) still end as explained dead letters."""
    inbox, port = smtp
    (good,) = _mail(engine, port, ("ada@example.com", {"subject": "s", "text": "t"}))
    no_rcpt, no_subject = effect_key("mail", "no-rcpt"), effect_key("mail", "no-subject")
    with engine.begin() as conn:
        for key, recipient, payload in (
            (no_rcpt, None, '{"subject": "s", "text": "t"}'),
            (no_subject, "bob@example.com", '{"text": "t"}'),
        ):
            conn.execute(
                sa.text(
                    "INSERT INTO effects (idempotency_key, endpoint, recipient, payload, "
                    "payload_sha256) VALUES (:k, 'mail', :r, CAST(:p AS jsonb), :h)"
                ),
                {"k": key, "r": recipient, "p": payload, "h": "0" * 64},
            )
    assert run_worker(fast, engine) == 0
    assert [m["To"] for m in inbox.messages] == ["ada@example.com"]
    states = _states(engine)
    assert states[good][0] == "delivered"
    assert states[no_rcpt][0] == "dead" and "recipient: is missing" in str(states[no_rcpt][1])
    assert states[no_subject][0] == "dead" and "payload.subject: is missing" in str(
        states[no_subject][1]
    )


def test_a_permanent_smtp_refusal_is_dead_a_temporary_one_retried(
    engine: Engine, fast: Settings, smtp: tuple[Inbox, int]
) -> None:
    inbox, port = smtp
    inbox.refuse_with = "450 mailbox busy"
    (key,) = _mail(engine, port, ("c@example.com", {"subject": "s", "text": "t"}))
    assert run_worker(fast, engine) == 0
    with engine.connect() as conn:
        outcomes = conn.execute(
            sa.text("SELECT outcome, status_code FROM delivery_attempts ORDER BY id")
        ).all()
    assert [tuple(o) for o in outcomes] == [("retry", 450), ("retry", 450), ("dead", 450)]
    assert _states(engine)[key][0] == "dead"


class Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


FORGED = (
    "info    spark_outbox.dispatch.recorder: delivered  event=effect.delivered"
    " idempotency_key=forged"
)


def test_a_multi_line_smtp_reply_cannot_forge_a_line_in_text_logs(
    engine: Engine, fast: Settings, smtp: tuple[Inbox, int]
) -> None:
    """A server's refusal whose second reply line is a whole fake log line: the
    attempt's error keeps the reply's lines (the database is no log), and the text
    log's line for it stays one line, the fake one escaped inside it."""
    inbox, port = smtp
    inbox.refuse_with = f"550-mailbox unavailable\r\n550 {FORGED}"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    counter = Counting()
    records = counter.records
    root = logging.getLogger()
    root.addHandler(handler)
    root.addHandler(counter)
    try:
        (key,) = _mail(engine, port, ("c@example.com", {"subject": "s", "text": "t"}))
        assert run_worker(fast, engine) == 0
    finally:
        root.removeHandler(handler)
        root.removeHandler(counter)
    state, error = _states(engine)[key]
    assert state == "dead" and error is not None and f"unavailable\n{FORGED}" in error
    lines = stream.getvalue().splitlines()
    assert len(lines) == len(records)  # one line per record
    (line,) = [line for line in lines if "forged" in line]
    assert line.startswith("warning spark_outbox.dispatch.recorder: not delivered")
    assert f"mailbox unavailable\\n{FORGED}" in line


BAD_EMAILS = [
    ("a@example.com, b@example.com", {"subject": "s", "text": "t"}, "recipient:"),
    ("Ann <ann@example.com>", {"subject": "s", "text": "t"}, "recipient:"),
    ("ann@example.com\r\nBcc: eve@example.com", {"subject": "s", "text": "t"}, "recipient:"),
    ("jürgen@exämple.com", {"subject": "s", "text": "t"}, "recipient:"),
    ("ann@example.com\n", {"subject": "s", "text": "t"}, "recipient:"),
    (None, {"subject": "s", "text": "t"}, "recipient: is missing"),
    ("ann@example.com", {"subject": "Hi\r\nBcc: eve@example.com", "text": "t"}, "payload.subject:"),
    ("ann@example.com", {"subject": "Hi"}, "payload.text:"),
    ("ann@example.com", {"subject": 7, "text": "t"}, "payload.subject:"),
    ("ann@example.com", {"subject": "s", "text": "t", "html": 5}, "payload.html:"),
]


def test_mail_a_channel_cannot_render_is_one_attempt_dead_with_the_field_and_the_fix(
    engine: Engine, db_url: str, smtp: tuple[Inbox, int], tmp_path: Path
) -> None:
    """Stored by any producer (even one that skipped the enqueue-time check): the
    real CLI with --until-idle makes one attempt each, dead-letters it and returns."""
    inbox, port = smtp
    _mail(engine, port, ("ok@example.com", {"subject": "fine", "text": "t"}))
    with engine.begin() as conn:
        for i, (recipient, payload, _) in enumerate(BAD_EMAILS):
            conn.execute(
                sa.text(
                    "INSERT INTO effects (idempotency_key, endpoint, recipient, payload,"
                    " payload_sha256) VALUES (:k, 'mail', :r, CAST(:p AS jsonb), 'x')"
                ),
                {"k": effect_key("bad", i), "r": recipient, "p": json.dumps(payload)},
            )
    worker = procs.start(procs.worker_env(db_url), "--until-idle", log=tmp_path / "w.log")
    assert worker.wait(60) == 0, (tmp_path / "w.log").read_text()[-3000:]
    states = _states(engine)
    with engine.connect() as conn:
        attempts = dict(
            conn.execute(
                sa.text(
                    "SELECT e.idempotency_key, count(*) FROM delivery_attempts a"
                    " JOIN effects e ON e.id = a.effect_id GROUP BY 1"
                )
            ).all()
        )
    for i, (_, _, reason) in enumerate(BAD_EMAILS):
        key = effect_key("bad", i)
        state, error = states[key]
        assert state == "dead" and attempts[key] == 1, (i, state, attempts.get(key))
        assert error is not None and error.startswith(reason), (i, error)
        assert "; " in error  # ... and the fix follows the problem
    assert [m["To"] for m in inbox.messages] == ["ok@example.com"]
