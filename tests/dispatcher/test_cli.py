"""`outbox endpoints ...` through the real argument parser, and worker metrics."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from spark_outbox.cli.main import main
from spark_outbox.core import db, endpoints, revisions
from spark_outbox.core.endpoints import secret_bytes
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch.metrics import Metrics
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, run_worker


def _cli(db_url: str, *argv: str) -> int:
    """``outbox`` in-process; the URL (it has a password) goes in DATABASE_URL."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        return main(["--log-format", "text", *argv])


def test_endpoints_add_list_show_pause_resume(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _cli(
            db_url,
            "endpoints",
            "add",
            "webhook",
            "billing-webhook",
            "--url",
            "https://example.com/hooks",
            "--retry-schedule",
            "0,5,60",
            "--json",
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    secret = created["signing_secret"]
    assert secret.startswith("whsec_") and len(secret_bytes(secret)) >= 24
    assert created["retry_schedule_s"] == [0.0, 5.0, 60.0]

    assert _cli(db_url, "endpoints", "list", "--json") == 0
    listed = capsys.readouterr().out
    assert secret not in listed and json.loads(listed)[0]["name"] == "billing-webhook"

    assert _cli(db_url, "endpoints", "pause", "billing-webhook", "--reason", "maintenance") == 0
    assert _cli(db_url, "endpoints", "show", "billing-webhook") == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["enabled"] is False and shown["paused_reason"] == "maintenance"
    assert secret not in json.dumps(shown)

    assert _cli(db_url, "endpoints", "resume", "billing-webhook", "--reason", "done") == 0
    assert _cli(db_url, "endpoints", "show", "billing-webhook") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["enabled"] is True

    engine = db.create_engine(db_url)
    try:
        with engine.connect() as conn:
            actions = conn.execute(
                sa.text("SELECT actor, action, target, reason FROM operator_actions ORDER BY id")
            ).all()
    finally:
        engine.dispose()
    actor = f"cli:{getpass.getuser()}"
    assert [tuple(a) for a in actions] == [
        (actor, "create_endpoint", "billing-webhook", "registered with outbox endpoints add"),
        (actor, "pause_endpoint", "billing-webhook", "maintenance"),
        (actor, "resume_endpoint", "billing-webhook", "done"),
    ]


def test_bad_endpoint_input_names_the_field_and_the_fix(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(db_url, "endpoints", "add", "webhook", "x", "--url", "ftp://nowhere") == 2
    err = capsys.readouterr().err
    assert "url:" in err and "https://" in err
    assert (
        _cli(
            db_url,
            "endpoints",
            "add",
            "email",
            "m",
            "--smtp-host",
            "h",
            "--smtp-port",
            "25",
            "--mail-from",
            "a@b.c",
            "--smtp-password-env",
            "NOPE_NOT_SET",
        )
        == 2
    )
    assert "NOPE_NOT_SET" in capsys.readouterr().err


def test_metrics_count_outcomes_by_endpoint(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    receiver.script("/hook", 500, 200)
    assert _cli_add(fast.database_url, receiver.url()) == 0
    procs.enqueue_many(engine, 3)
    metrics = Metrics()
    assert run_worker(fast, engine, metrics=metrics) == 0
    value = metrics.registry.get_sample_value
    assert value("outbox_deliveries_total", {"endpoint": "hook", "outcome": "delivered"}) == 3
    assert value("outbox_deliveries_total", {"endpoint": "hook", "outcome": "retry"}) == 1
    assert value("outbox_attempt_seconds_count", {"endpoint": "hook"}) == 4
    # every claim timed: the one that found the three, the retry's, the empty last ones
    assert value("outbox_claim_seconds_count") >= 2
    assert value("outbox_claim_seconds_sum") > 0


def _cli_add(db_url: str, url: str) -> int:
    return _cli(db_url, "endpoints", "add", "webhook", "hook", "--url", url)


def _outbox(
    db_url: str, *argv: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """The real ``outbox`` command in its own process, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "spark_outbox", "--log-format", "text", *argv],
        env={**os.environ, "DATABASE_URL": db_url, **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stored(db_url: str, name: str) -> endpoints.Endpoint:
    engine = db.create_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return endpoints.get(conn, name)
    finally:
        engine.dispose()


def test_secrets_come_from_stdin_or_the_environment_never_the_command_line(
    db_url: str,
) -> None:
    secret = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"
    hook = ["endpoints", "add", "webhook", "--url", "https://example.com/h", "--json"]
    piped = _outbox(db_url, *hook[:3], "piped", *hook[3:], "--secret-stdin", stdin=secret + "\n")
    assert piped.returncode == 0, piped.stderr
    assert secret not in piped.stdout  # given, so not echoed
    named = _outbox(
        db_url, *hook[:3], "named", *hook[3:], "--secret-env", "HOOK_SECRET", HOOK_SECRET=secret
    )
    assert named.returncode == 0, named.stderr
    mail = [
        "endpoints",
        "add",
        "email",
        "--smtp-host",
        "127.0.0.1",
        "--smtp-port",
        "587",
        "--smtp-tls",
        "starttls",
        "--mail-from",
        "billing@example.com",
        "--smtp-username",
        "billing",
    ]
    smtp = _outbox(
        db_url, *mail[:3], "mail", *mail[3:], "--smtp-password-stdin", stdin="hunter2-smtp\n"
    )
    assert smtp.returncode == 0, smtp.stderr
    assert _stored(db_url, "piped").signing_secret == secret
    assert _stored(db_url, "named").signing_secret == secret
    assert _stored(db_url, "mail").smtp_password == "hunter2-smtp"
    empty = _outbox(db_url, *mail[:3], "mail2", *mail[3:], "--smtp-password-stdin")
    assert empty.returncode == 2 and "standard input is empty" in empty.stderr
    # An unset shell variable ("--secret $SECRET") is refused, not silently replaced.
    unset = _outbox(db_url, *hook[:3], "unset", *hook[3:], "--secret", "")
    assert unset.returncode == 2 and "--secret: empty" in unset.stderr
    shown = _outbox(db_url, "endpoints", "show", "piped")  # JSON
    created = json.loads(shown.stdout)["created_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", created), created


def test_a_password_in_database_url_is_refused_with_the_fix(db_url: str) -> None:
    """ps shows every process's arguments to every user; DATABASE_URL stays private."""
    url = make_url(db_url)
    shown = _outbox("", "--database-url", db_url, "db", "current")
    assert shown.returncode == 2
    assert "DATABASE_URL" in shown.stderr and "PGPASSWORD" in shown.stderr
    assert str(url.password) not in shown.stderr + shown.stdout
    # The documented way out: the URL without its password, the password in PGPASSWORD.
    bare = f"postgresql://{url.username}@{url.host}:{url.port}/{url.database}"
    works = _outbox("", "--database-url", bare, "db", "current", PGPASSWORD=str(url.password))
    assert works.returncode == 0, works.stderr
    assert works.stdout.strip() == revisions.head()
