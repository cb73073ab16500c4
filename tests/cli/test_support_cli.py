"""The CLI as support uses it: a reference's effects at any age, "showing 100 of 171"
when a page cuts, an effect by its key's printed start, many keys at once; and an
operator's resend, counted first, refused with its reason."""

from __future__ import annotations

import io
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from tests.api.builders import add_attempt, add_effect
from tests.conftest import insert_billing_endpoints


@pytest.fixture
def many(in_db: str, engine: Engine) -> list[str]:
    """171 effects of one business reference, a year old; every tenth delivered."""
    insert_billing_endpoints(engine)
    keys = []
    with engine.begin() as conn:
        for i in range(171):
            effect = add_effect(conn, f"ref-{i}", recipient=f"c{i}@example.com")
            if i % 10 == 0:
                add_attempt(conn, effect, "delivered", status_code=200)
            keys.append(effect.key)
        conn.execute(
            sa.text(
                "UPDATE effects SET reference = 'INV-2025-0042',"
                " created_at = now() - interval '1 year'"
            )
        )
    return keys


def test_effects_list_by_reference_finds_old_effects_and_says_when_it_cuts(
    many: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["effects", "list", "--reference", "INV-2025-0042"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[-2:] == ["reference", "idempotency_key"]
    assert len(lines) == 101 and all("INV-2025-0042" in line for line in lines[1:])
    assert "showing 100 of 171" in err and "--cursor" in err
    assert main(["effects", "list", "--reference", "INV-2025-0042", "--limit", "500"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 172 and "showing" not in err


def test_effects_show_takes_a_keys_printed_start_and_lookup_resolves_many_at_once(
    many: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = many[0]
    assert main(["effects", "show", key[:12] + "…"]) == 0
    assert f"idempotency_key  {key}" in capsys.readouterr().out
    asked = [many[1][:12] + "…", many[2], "not-a-key", "0123456789abcdef"]
    keys = ("\n".join(asked[2:]) + "\n").encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(keys)))
    assert main(["effects", "lookup", *asked[:2], "--file", "-"]) == 1  # two name nothing
    out, err = capsys.readouterr()
    rows = out.splitlines()[1:]
    assert [r.split()[0] for r in rows] == asked
    assert rows[0].endswith(many[1]) and "pending" in rows[0] and rows[1].endswith(many[2])
    assert "not a key or the start of one" in rows[2] and "no effect" in rows[3]
    assert "2 of 4 named no effect, or several" in err
    assert main(["effects", "lookup", many[3], many[4], "--json"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [f["effects"][0]["idempotency_key"] for f in found] == many[3:5]


def test_an_operator_resends_from_the_cli_after_a_dry_run_and_a_refusal_names_why(
    many: list[str], capsys: pytest.CaptureFixture[str], engine: Engine
) -> None:
    delivered, pending = many[0], many[1]
    reason = ["--reason", "customer restored a backup"]
    assert main(["effects", "resend", delivered[:12] + "…", *reason, "--dry-run"]) == 0
    assert f"dry run: 1 effect(s) of {delivered}" in capsys.readouterr().out
    assert main(["effects", "resend", "0", *reason, "--dry-run"]) == 2  # too short a start
    assert "(8+ hex characters)" in capsys.readouterr().err
    assert main(["effects", "resend", delivered, *reason]) == 0
    assert "1 effect(s) of " + delivered + " will be sent again" in capsys.readouterr().out
    assert main(["effects", "show", delivered]) == 0
    shown = capsys.readouterr().out
    assert "state            pending" in shown and "resend           by cli:" in shown
    assert "customer restored a backup" in shown
    assert main(["effects", "resend", pending, *reason]) == 2
    assert "only a delivered or dead effect is resent" in capsys.readouterr().err
    bulk = ["effects", "resend", "--reference", "INV-2025-0042", "--state", "delivered"]
    assert main([*bulk, *reason, "--dry-run", "--cap", "5"]) == 0
    out = capsys.readouterr().out
    assert "more than 5 effect(s)" in out and "over --cap 5" in out  # 17 left delivered
    assert main([*bulk, *reason, "--cap", "5"]) == 2
    assert "more than 5 effects match" in capsys.readouterr().err
    assert main([*bulk, *reason, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["resent"] == 17 and done["dry_run"] is False
    with engine.connect() as conn:
        actions = conn.execute(
            sa.text("SELECT action, actor FROM operator_actions ORDER BY id")
        ).all()
    assert [a for a, _ in actions] == ["resend", "bulk_resend"]
    assert all(actor.startswith("cli:") for _, actor in actions)
