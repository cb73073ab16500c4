"""CLI commands in process, on a real database: finding effects and rejects, tokens,
the database URL for psql and SQLAlchemy, the SSRF warning when adding an endpoint."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import tokens
from spark_outbox.core import db
from spark_outbox.core.schema import rejects
from tests.api.builders import story
from tests.conftest import insert_billing_endpoints


@pytest.fixture
def built(in_db: str, engine: Engine) -> dict[str, object]:
    insert_billing_endpoints(engine)
    made = story(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(rejects).values(
                job="billing",
                batch_id="2026-11-21",
                run_id=uuid.uuid4(),
                reason="recipient: 'x' is not exactly one e-mail address; give one plain address",
                raw_row={"idempotency_key": "k", "recipient": "x", "payload": '{"a": 1}'},
            )
        )
    return dict(made)


def test_effects_list_finds_a_batch_without_a_window_and_shows_one_effect(
    built: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    batch = ["effects", "list", "--job", "billing", "--batch-id", "2026-11-21"]
    assert main([*batch, "--json", "--log-level", "WARNING"]) == 0  # a global option after
    page = json.loads(capsys.readouterr().out)
    keys = {built["batch0"].key, built["batch1"].key}  # type: ignore[attr-defined]
    assert {e["idempotency_key"] for e in page["items"]} == keys and page["next_cursor"] is None
    assert all(e["created_at"].endswith("Z") for e in page["items"])

    assert main(batch) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "created_at", "state", "attempts", "endpoint", "recipient", "reference", "idempotency_key",
    ]  # fmt: skip
    assert len(table) == 3 and all(k in "".join(table) for k in keys)

    dead = built["dead"].key  # type: ignore[attr-defined]
    assert main(["effects", "list", "--state", "dead", "--json"]) == 0  # the last 31 days
    assert [e["idempotency_key"] for e in json.loads(capsys.readouterr().out)["items"]] == [dead]
    assert main(["effects", "show", dead]) == 0
    shown = capsys.readouterr().out
    assert "state            dead" in shown and "HTTP 400" in shown
    assert "next_attempt_at  \n" in shown  # finished: no next attempt


def test_rejects_list_shows_a_batchs_rejects_with_reasons(
    built: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["rejects", "list", "--job", "billing", "--batch-id", "2026-11-21"]
    assert main([*args, "--json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)["items"]
    assert item["reason"].startswith("recipient:") and item["raw_row"]["recipient"] == "x"
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["rejected_at", "reason", "raw_row"] and len(lines) == 2


def test_bad_search_input_is_one_line_naming_the_field(
    in_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["effects", "list", "--recipient", "a@b.c", "--since", "yesterday"]) == 2
    assert "since: 'yesterday' is not ISO 8601" in capsys.readouterr().err
    assert main(["effects", "list", "--job", "billing"]) == 0  # a job alone: the last 31 days
    assert main(["effects", "show", "f" * 64]) == 2
    assert "no effect with key" in capsys.readouterr().err


def test_tokens_create_prints_only_the_token_on_stdout(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tokens", "create", "--name", "ann", "--role", "support"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out == f"{token}\n" and "shown once" in err
    with engine.connect() as conn:
        assert tokens.authenticate(conn, token).name == "ann"


def test_db_url_works_with_psql_and_with_sqlalchemy(
    in_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "url"]) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith("postgresql://")
    psql = subprocess.run(
        ["psql", url, "-tAc", "SELECT count(*) FROM endpoints"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (psql.returncode, psql.stdout) == (0, "0\n"), psql.stderr
    engine = db.create_engine(url)  # the project's helper takes it as printed
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
    assert main(["db", "url", "--sqlalchemy"]) == 0
    plain = sa.create_engine(capsys.readouterr().out.strip())  # plain SQLAlchemy, as printed
    try:
        with plain.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        plain.dispose()


def test_a_loopback_webhook_warns_with_the_allow_list_setting(
    in_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["endpoints", "add", "webhook"]
    assert main([*add, "local", "--url", "http://localhost:8900/hooks"]) == 0
    err = capsys.readouterr().err
    assert "endpoint 'local': localhost is 127.0.0.1, a loopback address" in err
    assert "OUTBOX_SSRF_ALLOW_NETWORKS=127.0.0.1/32" in err
    assert main([*add, "lan", "--url", "http://10.1.2.3/hooks"]) == 0
    assert "10.1.2.3 is 10.1.2.3, a private address" in capsys.readouterr().err
    # (stderr also carries the audit's log line of each creation: no warning is the point)
    assert main([*add, "public", "--url", "https://93.184.215.14/hooks"]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setenv("OUTBOX_SSRF_ALLOW_NETWORKS", "127.0.0.0/8")
    assert main([*add, "allowed", "--url", "http://127.0.0.1:8900/hooks"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_tokens_create_refuses_a_name_the_system_writes_in_one_line(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tokens", "create", "--name", "cli:root", "--role", "operator"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("outbox: error: name: 'cli:root' is reserved")
    assert main(["tokens", "create", "--name", "system", "--role", "support"]) == 2
    capsys.readouterr()
    with engine.connect() as conn:
        assert [t.name for t in tokens.list_all(conn)] == []
