"""SMTP done right, against real servers on loopback: STARTTLS and implicit TLS
with AUTH (a self-signed CA the test trusts), no credentials over plaintext
unless the endpoint opted in, and one deadline for a whole send."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_email
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import run_worker

USER, PASSWORD = "billing", "s3cret-pw"


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.logins: list[tuple[str, bool]] = []  # (user, over TLS)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.content)
        return "250 OK"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append((data.login.decode(), session.ssl is not None))
        ok = (data.login.decode(), data.password.decode()) == (USER, PASSWORD)
        return AuthResult(success=ok)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    pem = tmp_path_factory.mktemp("ca") / "ca.pem"
    authority.cert_pem.write_to_path(str(pem))
    return authority, pem


def _server_context(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return context


@contextlib.contextmanager
def smtp_server(mailbox: Mailbox, **kw: Any) -> Iterator[int]:
    port = free_port()
    controller = Controller(
        mailbox, hostname="127.0.0.1", port=port, authenticator=mailbox.authenticate, **kw
    )
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


def _endpoint(engine: Engine, port: int, tls: str = "none", **kw: Any) -> str:
    """An e-mail endpoint (one attempt, then dead) with one effect waiting for it."""
    values: dict[str, Any] = {"smtp_username": USER, "smtp_password": PASSWORD} | kw
    with engine.begin() as conn:
        add_email(
            conn,
            name="mail",
            smtp_host="127.0.0.1",
            smtp_port=port,
            mail_from="billing@example.com",
            smtp_tls=tls,
            retry_schedule_s=(0,),
            **values,
        )
        key = effect_key("tls", tls)
        enqueue(
            conn,
            idempotency_key=key,
            endpoint="mail",
            payload={"subject": "Invoice", "text": "Hello"},
            recipient="ann@example.com",
        )
    return key


def _attempt(engine: Engine) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT a.outcome, a.error_class, a.error, a.duration_ms, e.state"
                " FROM delivery_attempts a JOIN effects e ON e.id = a.effect_id"
            )
        ).one()


@pytest.mark.parametrize("tls", ["starttls", "tls"])
def test_mail_goes_over_starttls_and_implicit_tls_with_auth_to_a_server_we_verify(
    engine: Engine, fast: Settings, ca: tuple[trustme.CA, Path], tls: str
) -> None:
    authority, pem = ca
    mailbox = Mailbox()
    context = _server_context(authority)
    server_kw: dict[str, Any] = (
        {"tls_context": context, "require_starttls": True}
        if tls == "starttls"
        else {"ssl_context": context, "auth_require_tls": False}
    )
    with smtp_server(mailbox, **server_kw) as port:
        _endpoint(engine, port, tls)
        assert run_worker(dataclasses.replace(fast, smtp_ca_file=str(pem)), engine) == 0
    assert _attempt(engine).outcome == "delivered"
    assert len(mailbox.messages) == 1 and b"Subject: Invoice" in mailbox.messages[0]
    # STARTTLS: the server saw the login on the upgraded session. Implicit TLS: the
    # server's socket speaks only TLS, so any login at all came over TLS.
    over_tls = tls == "starttls"
    assert mailbox.logins == [(USER, over_tls)]


def test_a_server_whose_certificate_we_do_not_trust_gets_no_password(
    engine: Engine, fast: Settings, ca: tuple[trustme.CA, Path]
) -> None:
    authority, _ = ca
    mailbox = Mailbox()
    context = _server_context(authority)
    with smtp_server(mailbox, tls_context=context, require_starttls=True) as port:
        _endpoint(engine, port, "starttls")
        assert run_worker(fast, engine) == 0  # the system CAs only: not ours
    row = _attempt(engine)
    assert row.outcome == "dead" and row.error_class == "TlsFailed"  # one-step schedule
    assert mailbox.logins == [] and mailbox.messages == []


def test_credentials_over_plaintext_are_refused_unless_the_endpoint_opts_in(
    engine: Engine, fast: Settings
) -> None:
    with engine.begin() as conn, pytest.raises(InvalidRequest) as refused:
        add_email(
            conn,
            name="plain",
            smtp_host="127.0.0.1",
            smtp_port=25,
            mail_from="billing@example.com",
            smtp_username=USER,
            smtp_password=PASSWORD,
        )
    assert refused.value.field == "smtp_tls" and "--smtp-allow-plaintext-auth" in str(refused.value)
    mailbox = Mailbox()
    with smtp_server(mailbox, auth_require_tls=False) as port:
        _endpoint(engine, port, "none", smtp_allow_plaintext_auth=True)
        # An endpoint stored before the opt-in existed: credentials, no TLS, not opted in.
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE endpoints SET smtp_allow_plaintext_auth = false"))
        assert run_worker(fast, engine) == 0
        row = _attempt(engine)
        assert (row.outcome, row.error_class) == ("dead", "PlaintextAuthRefused")
        assert "--smtp-tls starttls" in row.error and mailbox.logins == []
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE endpoints SET smtp_allow_plaintext_auth = true, updated_at = now();"
                    " UPDATE effects SET state = 'pending', next_attempt_at = now()"
                )
            )
        assert run_worker(fast, engine) == 0
    assert mailbox.logins == [(USER, False)] and len(mailbox.messages) == 1


def test_a_server_that_drips_its_replies_cannot_hold_a_send_past_the_deadline(
    engine: Engine, fast: Settings
) -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            for byte in b"220 slow.example.com ESMTP " + b"." * 1000:
                writer.write(bytes([byte]))  # one byte every 0.1 s: each read is "on time"
                await writer.drain()
                await asyncio.sleep(0.1)

    async def main() -> int:
        server = await asyncio.start_server(drip, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _endpoint(engine, port, timeout_s=1.0, smtp_username=None, smtp_password=None)
        from spark_outbox.dispatch.worker import Worker

        worker = Worker(fast, engine, database_url=fast.database_url, until_idle=True)
        try:
            return await asyncio.wait_for(worker.run(), 30)
        finally:
            server.close()

    assert asyncio.run(main()) == 0
    row = _attempt(engine)
    assert (row.outcome, row.error_class) == ("dead", "Timeout")
    assert 900 <= row.duration_ms < 3000  # the drip alone would take 100 s


def test_the_cli_refuses_a_password_over_plaintext_and_accepts_the_explicit_opt_in(
    db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_outbox.cli.main import main

    monkeypatch.setenv("SMTP_PW", PASSWORD)
    monkeypatch.setenv("DATABASE_URL", db_url)  # a password never goes in argv
    base = ["endpoints", "add", "email"]
    smtp = ["--smtp-host", "127.0.0.1", "--smtp-port", "25", "--mail-from", "b@example.com"]
    auth = ["--smtp-username", USER, "--smtp-password-env", "SMTP_PW"]
    assert main([*base, "plain", *smtp, *auth]) == 2
    assert "--smtp-allow-plaintext-auth" in capsys.readouterr().err
    assert main([*base, "relay", *smtp, *auth, "--smtp-allow-plaintext-auth", "--json"]) == 0
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, smtp_allow_plaintext_auth FROM endpoints")).all()
    assert [tuple(r) for r in rows] == [("relay", True)]
