"""Values an operator can type that once ended in a traceback, a forged line or a
rewritten terminal (found by probing the CLI as an attacker would): ports above
65535, durations of 99999999999 days, names with newlines, ESC sequences or
bidirectional overrides, a fullwidth reserved token name. Each is refused in one line
naming the field and the fix, and changes nothing; text shown from the database is
escaped whatever it holds."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.cli.output import cell
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.outside import check_name, one_line
from tests.conftest import insert_endpoint

WEBHOOK = ["--url", "https://partner.example.com/h"]


def _one_line_error(capsys: pytest.CaptureFixture[str], said: str) -> None:
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["dispatcher", "run", "--metrics-port", "70000"],
        ["verify", "--once", "--metrics-port", "99999999999999999999"],
        ["api", "serve", "--port", "65536"],
        ["receiver", "serve", "--port", "-1"],
    ],
)
def test_a_port_out_of_range_is_an_argparse_error(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "is not a port: use 0 to 65535" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["purge", "--older-than", "99999999999d", "--dry-run"],
        ["purge", "--older-than", "5000000w", "--dry-run"],
        ["purge", "--older-than", "30d", "--forget-keys-older-than", "99999999999d"],
    ],
)
def test_a_duration_longer_than_100_years_is_refused(
    in_db: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    _one_line_error(capsys, "is longer than 100 years")


NAMES = ["a\nb", "ops\radmin", "x\x1b[31mred", "evil\u202etxt", "zero\u200bwidth", "n" * 201]


@pytest.mark.parametrize("name", NAMES)
def test_an_endpoint_name_a_terminal_would_not_show_as_it_is_is_refused(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["endpoints", "add", "webhook", name, *WEBHOOK]) == 2
    _one_line_error(capsys, "name: ")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM endpoints")).scalar() == 0


@pytest.mark.parametrize("name", [*NAMES, "\uff55\uff49:x", "\uff53\uff59\uff53\uff54\uff45\uff4d"])
def test_a_token_name_that_could_forge_a_line_or_an_actor_is_refused(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["tokens", "create", "--name", name, "--role", "support"]) == 2
    _one_line_error(capsys, "name: ")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM api_tokens")).scalar() == 0


def test_a_name_stored_before_names_were_checked_is_listed_escaped(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    insert_endpoint(engine, "old\x1b[2K\rfake")
    assert main(["endpoints", "list"]) == 0
    out = capsys.readouterr().out
    assert "old\\x1b[2K\\rfake" in out and "\x1b" not in out and "\r" not in out


TERMINAL_CONTROLS = {"Cc", "Zl", "Zp"}
BIDI = {chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


@given(st.text())
def test_nothing_shown_on_one_line_holds_a_control_or_a_bidirectional_override(
    text: str,
) -> None:
    for shown in (one_line(text), cell(text)):
        assert not any(unicodedata.category(c) in TERMINAL_CONTROLS for c in shown), shown
        assert not BIDI & set(shown), shown


@given(st.text(max_size=300))
def test_a_name_is_taken_printable_or_refused_naming_the_field(text: str) -> None:
    try:
        taken = check_name("name", text, "alice")
    except InvalidRequest as refused:
        assert refused.field == "name"
        return
    assert taken.isprintable() and len(taken) <= 200


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://[::1", "is not an http(s) URL with a host"),
        ("http://127.0.0.1:99999/", "has a port out of range"),
        ("http://127.0.0.1:0/", "has a port out of range"),
        ("http://127.0.0.1:1/\r\nX-Evil: 1", "holds spaces or control characters"),
        ("http://example.com/a b", "holds spaces or control characters"),
    ],
)
def test_a_webhook_url_that_could_never_be_sent_to_is_refused_at_input(
    in_db: str, engine: Engine, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    assert main(["endpoints", "add", "webhook", "partner", "--url", url]) == 2
    _one_line_error(capsys, said)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM endpoints")).scalar() == 0


@pytest.mark.parametrize("pace", ["1e-308", "1e-9", "0.009"])
def test_a_pace_that_would_rest_for_ever_is_refused(
    in_db: str, capsys: pytest.CaptureFixture[str], pace: str
) -> None:
    assert main(["purge", "--older-than", "30d", "--pace", pace]) == 2
    _one_line_error(capsys, "use a number from 0.01 to 1")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("garbage", "DATABASE_URL (<a database URL that does not parse>) is not a database URL"),
        ("mysql://u:s3cret@db.example.com/app", "names 'mysql'; spark-outbox runs on PostgreSQL"),
        ("sqlite:///outbox.db", "names 'sqlite'"),
        ("postgresql://u:s3cret@[::1/app", "is not a database URL"),
        ("postgresql://u:s3cret@db.example.com:99999/app", "has port 99999"),
        ("postgresql://u@db.example.com:0/app", "has port 0"),
    ],
)
def test_a_database_url_that_is_no_postgresql_url_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["endpoints", "list"]) == 2
    _one_line_error(capsys, said)
    assert "s3cret" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["endpoints", "list"],
        ["endpoints", "show", "billing-webhook"],
        ["tokens", "list"],
        ["purge", "--older-than", "30d"],
        ["reconcile", "billing"],
        ["db", "upgrade"],
        ["effects", "list", "--endpoint", "billing-webhook"],
        ["effects", "show", "a" * 64],
        ["effects", "uncertain"],
        ["effects", "lookup", "a" * 64],
        ["effects", "resend", "a" * 64, "--reason", "drill"],
        ["effects", "requeue", "a" * 64, "--reason", "drill"],
        ["rejects", "list", "--job", "billing", "--batch-id", "2026-01-01"],
        ["batches", "held"],
        ["batches", "release", "billing", "2026-01-01", "--reason", "drill"],
    ],
)
def test_an_unreachable_database_is_one_line_whichever_command_meets_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:s3cret@127.0.0.1:1/app")
    assert main(argv) == 2
    _one_line_error(capsys, "the database is unavailable")


def test_a_default_window_before_the_first_instant_starts_at_it(
    in_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["effects", "list", "--endpoint", "x", "--until", "0001-01-05T00:00:00Z"]
    assert main(argv) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_an_until_out_of_range_in_utc_is_refused_naming_it(
    in_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["effects", "list", "--endpoint", "x", "--until", "0001-01-01T00:00:00+05:00"]
    assert main(argv) == 2
    _one_line_error(capsys, "until")


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("missing", "cannot read"),
        ("directory", "cannot read"),
        ("/dev/zero", "holds more than 1024 KiB"),
        ("binary", "is not UTF-8 text"),
    ],
)
def test_a_lookup_file_that_cannot_be_keys_is_refused_in_one_line(
    in_db: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    where: str,
    said: str,
) -> None:
    paths = {
        "missing": tmp_path / "nope.txt",
        "directory": tmp_path,
        "/dev/zero": Path("/dev/zero"),
        "binary": tmp_path / "keys.bin",
    }
    paths["binary"].write_bytes(b"\xff\xfe13dd1f9d\n")
    assert main(["effects", "lookup", "--file", str(paths[where])]) == 2
    _one_line_error(capsys, f"--file: {said}" if said == "cannot read" else said)


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--smtp-host", "smtp.example.com\r\nRSET", "smtp_host"),
        ("--smtp-host", "smtp example.com", "smtp_host"),
        ("--mail-from", "billing@example.com\r\nBcc: all@example.com", "mail_from"),
    ],
)
def test_an_email_endpoint_with_a_line_break_in_its_server_or_sender_is_refused(
    in_db: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: str,
    field: str,
) -> None:
    given = {"--smtp-host": "smtp.example.com", "--mail-from": "billing@example.com"}
    given[flag] = value
    argv = ["endpoints", "add", "email", "mail", "--smtp-port", "25"]
    argv += [part for pair in given.items() for part in pair]
    assert main(argv) == 2
    _one_line_error(capsys, f"{field}: ")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM endpoints")).scalar() == 0
