"""The argument parser: global options in both positions, defaults in every help."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_outbox.cli.main import build_parser, log_format


def _parsers(
    parser: argparse.ArgumentParser, path: str = "outbox"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_option_help_shows_its_default() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            flag = action.nargs == 0  # store_true, --help: off unless given
            hidden = action.help == argparse.SUPPRESS  # internal, not in --help
            if not action.option_strings or flag or action.required or hidden:
                continue
            text = formatter._expand_help(action) if action.help else ""
            if "default" not in text:
                missing.append(f"{path} {action.option_strings[-1]}: {text!r}")
    assert missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--state-dir", "/tmp/s", "--log-level", "DEBUG", "db", "sql"],
        ["db", "sql", "--state-dir", "/tmp/s", "--log-level", "DEBUG"],
        ["db", "--state-dir", "/tmp/s", "sql", "--log-level", "DEBUG"],
    ],
)
def test_global_options_are_accepted_before_and_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.state_dir == "/tmp/s" and args.log_level == "DEBUG"
    assert args.database_url is None and args.log_format is None


def test_an_option_after_the_subcommand_wins_over_one_before_it() -> None:
    args = build_parser().parse_args(["--log-level", "ERROR", "db", "sql", "--log-level", "DEBUG"])
    assert args.log_level == "DEBUG"


def test_logs_are_text_on_a_terminal_and_json_otherwise(tmp_path: Path) -> None:
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            assert log_format(None, {}, terminal) == "text"
            assert log_format(None, {"OUTBOX_LOG_FORMAT": "json"}, terminal) == "json"
            assert log_format("json", {}, terminal) == "json"
    finally:
        os.close(leader)
        os.close(follower)
    with (tmp_path / "log").open("w") as file:
        assert log_format(None, {}, file) == "json"
        assert log_format(None, {"OUTBOX_LOG_FORMAT": "text"}, file) == "text"
