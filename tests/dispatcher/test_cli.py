"""`outbox endpoints ...` through the real argument parser, and worker metrics."""

from __future__ import annotations

import getpass
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher import db
from dispatcher.endpoints import secret_bytes
from dispatcher.metrics import Metrics
from dispatcher.settings import Settings
from outbox.cli import main
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, run_worker


def _cli(db_url: str, *argv: str) -> int:
    return main(["--database-url", db_url, "--log-format", "text", *argv])


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


def _cli_add(db_url: str, url: str) -> int:
    return _cli(db_url, "endpoints", "add", "webhook", "hook", "--url", url)
