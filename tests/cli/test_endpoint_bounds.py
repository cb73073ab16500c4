"""The CLI refuses numeric endpoint settings out of bounds (the API's bounds: one place,
dispatcher/bounds.py) with one line naming the field and the fix, and changes nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from tests.conftest import insert_endpoint

UPDATES = [
    (["--rate-limit-per-s", "1e308"], "rate_limit_per_s: 1e+308 is out of range"),
    (["--rate-limit-per-s", "nan"], "rate_limit_per_s: nan is not a finite number"),
    (["--rate-limit-per-s", "inf"], "rate_limit_per_s: inf is not a finite number"),
    (["--rate-limit-per-s", "-1"], "rate_limit_per_s: -1 is out of range"),
    (["--rate-limit-per-s", "0"], "rate_limit_per_s: 0 is out of range"),
    (["--max-in-flight", "0"], "max_in_flight: 0 is out of range"),
    (["--max-in-flight", "-4"], "max_in_flight: -4 is out of range"),
    (["--max-in-flight", "10000000000"], "max_in_flight: 1e+10 is out of range"),
    (["--timeout-s", "nan"], "timeout_s: nan is not a finite number"),
    (["--timeout-s", "1e308"], "timeout_s: 1e+308 is out of range"),
    (["--timeout-s", "0"], "timeout_s: 0 is out of range"),
    (["--retry-schedule", "0,1e308"], "retry_schedule_s[1]: 1e+308 is out of range"),
    (["--retry-schedule", "0,-5"], "retry_schedule_s[1]: -5 is out of range"),
    (["--retry-schedule", "inf"], "retry_schedule_s[0]: inf is not a finite number"),
]


@pytest.mark.parametrize(("options", "said"), UPDATES)
def test_an_update_out_of_bounds_is_one_line_naming_the_field_and_the_fix(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str], options: list[str], said: str
) -> None:
    insert_endpoint(engine, "hook")
    assert main(["endpoints", "update", "hook", *options, "--reason", "try"]) == 2
    err = capsys.readouterr().err
    assert said in err and "give " in err and err.count("\n") == 1
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT timeout_s, retry_schedule_s, rate_limit_per_s, max_in_flight"
                " FROM endpoints WHERE name = 'hook'"
            )
        ).one()
    assert tuple(row) == (10.0, None, None, None)


@pytest.mark.parametrize(("options", "said"), UPDATES)
def test_adding_a_webhook_out_of_bounds_is_refused_and_adds_nothing(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str], options: list[str], said: str
) -> None:
    add = ["endpoints", "add", "webhook", "partner", "--url", "https://partner.example.com/h"]
    assert main([*add, *options]) == 2
    assert said in capsys.readouterr().err
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM endpoints")).scalar() == 0


@pytest.mark.parametrize("port", ["0", "65536", "-25"])
def test_adding_an_email_endpoint_with_a_port_out_of_bounds_is_refused(
    in_db: str, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    add = ["endpoints", "add", "email", "mail", "--smtp-host", "127.0.0.1"]
    assert main([*add, "--smtp-port", port, "--mail-from", "a@example.com"]) == 2
    assert "smtp_port: " in capsys.readouterr().err


def test_values_within_bounds_are_stored(in_db: str, engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    options = ["--rate-limit-per-s", "1000000", "--max-in-flight", "1", "--timeout-s", "600"]
    schedule = ["--retry-schedule", "0,2592000"]
    assert main(["endpoints", "update", "hook", *options, *schedule, "--reason", "edge"]) == 0
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT timeout_s, retry_schedule_s, rate_limit_per_s, max_in_flight"
                " FROM endpoints WHERE name = 'hook'"
            )
        ).one()
    assert tuple(row) == (600.0, [0.0, 2592000.0], 1000000.0, 1)
