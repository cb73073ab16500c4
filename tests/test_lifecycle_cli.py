"""The lifecycle commands through the real argument parser and a real database:
endpoints update / rotate-secret / recover, purge, tokens; every change audited."""

from __future__ import annotations

import getpass
import json
import re

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from tests.api.builders import add_attempt, add_effect


def _cli(db_url: str, *argv: str) -> int:
    # A URL with a password never goes in argv (ps shows it): the environment carries it.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        return main(["--log-format", "text", *argv])


def _actions(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        query = "SELECT actor, action, target FROM operator_actions ORDER BY id"
        rows = conn.execute(sa.text(query))
        return [tuple(r) for r in rows]  # type: ignore[misc]


def test_endpoint_lifecycle_from_the_command_line(
    db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["endpoints", "add", "webhook", "hook", "--url", "https://example.com/h", "--json"]
    assert _cli(db_url, *add) == 0
    first = json.loads(capsys.readouterr().out)["signing_secret"]
    assert _cli(db_url, "endpoints", "rotate-secret", "hook", "--overlap", "2h", "--json") == 0
    rotated = json.loads(capsys.readouterr().out)
    assert rotated["signing_secret"] != first and rotated["previous_valid_until"]
    update = ["endpoints", "update", "hook", "--timeout-s", "3", "--rate-limit-per-s", "none"]
    assert _cli(db_url, *update, "--reason", "slow receiver") == 0
    assert json.loads(capsys.readouterr().out)["timeout_s"] == 3.0
    assert _cli(db_url, "endpoints", "update", "hook", "--url", "ftp://x", "--reason", "r") == 2
    assert "url:" in capsys.readouterr().err
    with engine.begin() as conn:
        dead = add_effect(conn, "d", endpoint="hook")
        add_attempt(conn, dead, "dead", status_code=500)
        second = add_effect(conn, "e", endpoint="hook")
        add_attempt(conn, second, "dead", status_code=500)
    recover = ["endpoints", "recover", "hook", "--since", "1d", "--reason", "back up"]
    assert _cli(db_url, *recover, "--dry-run", "--cap", "1") == 0  # counted up to cap + 1
    assert capsys.readouterr().out.startswith("more than 1 dead effect(s) of hook")
    assert _cli(db_url, *recover, "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.startswith("would requeue 2 dead effect") and re.search(r"since \S+Z$", out)
    assert _cli(db_url, *recover) == 0
    assert capsys.readouterr().out.startswith("requeued 2 dead effect")
    me = f"cli:{getpass.getuser()}"
    assert _actions(engine) == [
        (me, "create_endpoint", "hook"),
        (me, "rotate_secret", "hook"),
        (me, "update_endpoint", "hook"),
        (me, "recover_endpoint", "hook"),
    ]
    with engine.connect() as conn:
        details = conn.execute(sa.text("SELECT CAST(details AS text) FROM operator_actions"))
        text = " ".join(d for (d,) in details)
    assert first not in text and rotated["signing_secret"] not in text


def test_tokens_and_purge_from_the_command_line(
    db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(db_url, "tokens", "create", "--name", "tim", "--role", "support") == 0
    assert _cli(db_url, "tokens", "revoke", "tim", "--reason", "left the team") == 0
    _cli(db_url, "endpoints", "add", "webhook", "hook", "--url", "https://example.com/h")
    with engine.begin() as conn:
        done = add_effect(conn, "done", endpoint="hook")
        add_attempt(conn, done, "delivered", status_code=200)
        conn.execute(sa.text("UPDATE effects SET updated_at = now() - interval '31 days'"))
    capsys.readouterr()
    assert _cli(db_url, "purge", "--older-than", "30d", "--dry-run") == 0
    assert capsys.readouterr().out.startswith("would purge 1 finished effect")
    assert _cli(db_url, "purge", "--older-than", "30d") == 0
    assert capsys.readouterr().out.startswith("purged 1 effect(s) and 1 attempt(s)")
    assert _cli(db_url, "purge", "--older-than", "soon") == 2
    assert "--older-than" in capsys.readouterr().err
    with engine.begin() as conn:
        again = add_effect(conn, "again", endpoint="hook")
        add_attempt(conn, again, "delivered", status_code=200)
        conn.execute(sa.text("UPDATE effects SET updated_at = now() - interval '31 days'"))
    assert _cli(db_url, "purge", "--older-than", "30d", "--pace", "0.5") == 0
    out = capsys.readouterr().out
    assert out.startswith("purged 1 effect(s)") and "with its rests at pace 0.5" in out
    for pace in ("0", "1.5", "nan"):  # refused before anything is touched
        assert _cli(db_url, "purge", "--older-than", "30d", "--pace", pace) == 2
        assert "--pace" in capsys.readouterr().err
    assert [a[1:] for a in _actions(engine)] == [
        ("create_token", "tim"),
        ("revoke_token", "tim"),
        ("create_endpoint", "hook"),
        ("purge", "effects finished more than 30d ago"),
        ("purge", "effects finished more than 30d ago"),  # the paced one
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["effects", "uncertain"],
        ["effects", "resolve", "--endpoint", "crm", "--send-again", "--reason", "r", "--dry-run"],
        ["batches", "held"],
    ],
)
def test_commands_say_the_database_is_unavailable_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback when PostgreSQL cannot be reached: one line and exit 2, as
    every other command (db.translated)."""
    assert _cli("postgresql://nobody@127.0.0.1:1/none", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("outbox: error: the database is unavailable"), err
