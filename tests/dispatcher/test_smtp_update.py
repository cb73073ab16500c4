"""An e-mail endpoint's SMTP settings changed from the command line (the password from
stdin or a named environment variable, never argv), then used by a real worker against
a real SMTP server with AUTH on loopback; audited old -> new, the password "(changed)"."""

from __future__ import annotations

import email
import email.policy
import io
import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core import endpoints
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import run_worker
from tests.dispatcher.test_smtp_tls import PASSWORD, USER, Mailbox, _endpoint, smtp_server
from tests.test_lifecycle_cli import _cli


def _update(db_url: str, *argv: str) -> int:
    return _cli(db_url, "endpoints", "update", "mail", *argv, "--reason", "relay moved")


def test_smtp_server_login_password_and_from_are_updated_and_used_by_the_next_send(
    db_url: str,
    engine: Engine,
    fast: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # Registered against a relay that is gone, without a login.
    _endpoint(engine, free_port(), smtp_username=None, smtp_password=None)
    mailbox = Mailbox()
    with smtp_server(mailbox, auth_require_tls=False) as port:
        login = ["--smtp-host", "127.0.0.1", "--smtp-port", str(port), "--smtp-username", USER]
        # A login over plain text still needs the explicit opt-in: refused, nothing changed.
        monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
        assert _update(db_url, *login, "--smtp-password-stdin") == 2
        assert "smtp_tls" in capsys.readouterr().err
        monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
        opt_in = ["--smtp-allow-plaintext-auth", "--mail-from", "invoices@example.com"]
        assert _update(db_url, *login, "--smtp-password-stdin", *opt_in) == 0
        out = capsys.readouterr().out
        assert PASSWORD not in out and '"has_smtp_password": true' in out
        assert run_worker(fast, engine) == 0
    assert mailbox.logins == [(USER, False)]
    (raw,) = mailbox.messages
    assert email.message_from_bytes(raw, policy=email.policy.default)["From"] == (
        "invoices@example.com"
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT details FROM operator_actions WHERE action = 'update_endpoint'")
        ).all()
    (changes,) = [r.details["changes"] for r in rows]
    assert changes["smtp_password"] == {"old": None, "new": "(changed)"}
    assert changes["smtp_username"] == {"old": None, "new": USER}
    assert changes["smtp_port"]["new"] == port and changes["smtp_allow_plaintext_auth"] == {
        "old": False,
        "new": True,
    }
    assert changes["mail_from"] == {"old": "billing@example.com", "new": "invoices@example.com"}
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert PASSWORD not in logged and PASSWORD not in str(rows)


def test_the_smtp_password_comes_from_a_named_variable_and_can_be_cleared(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _endpoint(engine, 2525, "starttls")
    monkeypatch.setenv("NEW_SMTP_PW", "rotated-pw")
    assert _update(db_url, "--smtp-password-env", "NEW_SMTP_PW") == 0
    with engine.connect() as conn:
        assert endpoints.get(conn, "mail").smtp_password == "rotated-pw"
    assert _update(db_url, "--smtp-username", "none", "--clear-smtp-password") == 0
    with engine.connect() as conn:
        ep = endpoints.get(conn, "mail")
        (details,) = conn.execute(
            sa.text(
                "SELECT details FROM operator_actions WHERE action = 'update_endpoint' "
                "ORDER BY id DESC LIMIT 1"
            )
        ).one()
    assert (ep.smtp_username, ep.smtp_password) == (None, None)
    assert details["changes"]["smtp_password"] == {"old": "***", "new": None}
    assert _update(db_url, "--smtp-password-env", "UNSET_VARIABLE_X") == 2


def test_a_webhook_refuses_smtp_settings_naming_the_field(
    db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.dispatcher.test_rotation import _hook

    _hook(engine, "https://example.com/h")
    update = ["endpoints", "update", "hook", "--smtp-port", "25", "--reason", "r"]
    assert _cli(db_url, *update) == 2
    assert "smtp_port: hook is a webhook endpoint" in capsys.readouterr().err
