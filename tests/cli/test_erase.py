"""``outbox erase`` in process, on a real database: the dry run lists and changes
nothing, the erasure erases and says so, bad input is one line naming the field."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from tests.api.builders import story
from tests.conftest import insert_billing_endpoints

BOB = "bob@example.com"


def _bob(engine: Engine, keys: list[str]) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT state, recipient FROM effects WHERE idempotency_key = ANY(:k) ORDER BY id"
            ),
            {"k": keys},
        )
        return [(r[0], r[1]) for r in rows]


def test_erase_dry_run_lists_then_the_erase_cancels_the_unsent_and_blanks_the_rest(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    insert_billing_endpoints(engine)
    made = story(engine)
    keys = [made["dead"].key, made["pending"].key]
    args = ["erase", "--recipient", BOB, "--reason", f"request of {BOB}"]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert made["pending"].key in out and "cancel" in out and made["dead"].key in out
    assert "dry run: 2 effect(s) of the person would be erased (1 unsent" in out
    assert _bob(engine, keys) == [("dead", BOB), ("pending", BOB)]

    assert main([*args, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["effects"], done["cancelled"], done["complete"]) == (2, 1, True)
    assert _bob(engine, keys) == [("dead", None), ("cancelled", None)]
    with engine.connect() as conn:
        reason = conn.execute(
            sa.text("SELECT reason FROM operator_actions WHERE action = 'erase'")
        ).scalar_one()
    assert reason == "request of [erased]"
    assert main(["effects", "show", made["dead"].key]) == 0
    shown = {line[:16].strip(): line[16:].strip() for line in capsys.readouterr().out.splitlines()}
    assert shown["purged_at"].startswith("20") and shown["payload"] == ""
    assert shown["last_error"].startswith("erased (operator action")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--reason", "x"], "recipient: no person selected"),
        (["--recipient", "a@b.c", "--reference", "r", "--reason", "x"], "reference: more than"),
        (
            ["--payload-field", "customer.id", "--reason", "x"],
            "payload_field: 'customer.id' has no",
        ),
        (["--payload-field", "customer.idd=4", "--reason", "x"], "payload_field: no effect's"),
        (["--recipient", "a@b.c", "--reason", " "], "reason: is empty"),
    ],
)
def test_bad_erase_input_is_one_line_naming_the_field(
    in_db: str, args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["erase", *args]) == 2
    assert said in capsys.readouterr().err


def test_erase_exits_3_and_says_to_run_again_when_an_effect_is_being_sent(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    insert_billing_endpoints(engine)
    made = story(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'leased', lease_token = gen_random_uuid(), "
                "lease_expires_at = now() + interval '1 minute' WHERE idempotency_key = :k"
            ),
            {"k": made["pending"].key},
        )
    assert main(["erase", "--recipient", BOB, "--reason", "request 9"]) == 3
    said = capsys.readouterr()
    assert "1 effect(s) of the person were erased" in said.out
    assert "1 effect(s) are being sent right now" in said.err and "run the same erase" in said.err
    assert _bob(engine, [made["dead"].key, made["pending"].key]) == [
        ("dead", None),
        ("leased", BOB),
    ]
