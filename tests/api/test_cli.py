"""The CLI: ``outbox tokens`` prints a token once; ``outbox api serve`` stops cleanly on SIGTERM."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import tokens
from tests.api.conftest import Served


def test_tokens_create_list_revoke(
    db_url: str, engine: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)  # a URL with a password never goes in argv
    base = ["--log-format", "text"]
    assert main([*base, "tokens", "create", "--name", "ann", "--role", "support", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    with engine.begin() as conn:
        assert tokens.authenticate(conn, created["token"]).role == "support"
    assert main([*base, "tokens", "list", "--json"]) == 0
    listed = capsys.readouterr().out
    assert json.loads(listed)["name"] == "ann" and created["token"] not in listed
    assert main([*base, "tokens", "revoke", "ann"]) == 0
    capsys.readouterr()
    with pytest.raises(tokens.AuthenticationFailed), engine.begin() as conn:
        tokens.authenticate(conn, created["token"])
    assert main([*base, "tokens", "revoke", "ann"]) == 2  # already revoked: says so
    assert "no live token" in capsys.readouterr().err


def test_api_serve_answers_over_http_and_exits_0_on_sigterm(served: Served) -> None:
    assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{served.url}/v1/status").status_code == 401
    assert served.stop() == 0
