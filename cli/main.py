"""``outbox``: one console script, one subcommand per area.

Each ``*_cmd`` module exposes ``register(subparsers)``; handlers receive the
parsed arguments and the process's one ``Settings`` and return an exit code.
Signals and logging are set up here, at the entry point, and nowhere else.
The global options are accepted before and after the subcommand (every parser
in the tree is an ``OutboxParser``), and every option's help shows its default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from spark_outbox.cli import extras
from spark_outbox.core import db, logs
from spark_outbox.core.errors import ConfigurationError, OutboxError
from spark_outbox.core.settings import Settings

COMMAND_MODULES = [
    "spark_outbox.cli.db_cmd",
    "spark_outbox.cli.demo_cmd",
    "spark_outbox.cli.receiver_cmd",
    "spark_outbox.cli.dispatcher_cmd",
    "spark_outbox.cli.endpoints_cmd",
    "spark_outbox.cli.effects_cmd",
    "spark_outbox.cli.api_cmd",
    "spark_outbox.cli.tokens_cmd",
    "spark_outbox.cli.purge_cmd",
    "spark_outbox.cli.erase_cmd",
    "spark_outbox.cli.reconcile_cmd",
    "spark_outbox.cli.verify_cmd",
    "spark_outbox.cli.batches_cmd",
    "spark_outbox.cli.spark_cmd",
]
# A process killed by SIGPIPE reports 128 + 13: what `yes | head` shows under pipefail.
CLOSED_PIPE_EXIT = 141


class HelpWithDefaults(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it already says its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        no_value = action.default in (None, argparse.SUPPRESS) or action.nargs == 0
        if "default" in text or action.required or no_value or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class OutboxParser(argparse.ArgumentParser):
    """Every (sub)parser of ``outbox``: the global options everywhere, defaults in help.

    ``add_subparsers`` builds children of the parent's class, so the whole tree
    gets the options. Below the top they default to SUPPRESS: a value given
    after the subcommand overrides one given before it, and absence changes nothing.
    """

    def __init__(self, *args: Any, top: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpWithDefaults)
        super().__init__(*args, **kwargs)
        _global_options(self, None if top else argparse.SUPPRESS)


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    group = parser.add_argument_group("global options (before or after the subcommand)")
    group.add_argument(
        "--database-url",
        default=default,
        help="PostgreSQL URL without a password (ps shows it to every user: put a URL "
        "with a password in $DATABASE_URL); default: $DATABASE_URL, else a private "
        "cluster under --state-dir",
    )
    group.add_argument(
        "--state-dir",
        default=default,
        help="local state directory, where the private PostgreSQL lives (default: "
        "$OUTBOX_STATE_DIR, else $XDG_STATE_HOME/spark-outbox, else "
        "~/.local/state/spark-outbox: one per user, whatever the current directory)",
    )
    group.add_argument(
        "--log-format",
        choices=["json", "text"],
        default=default,
        help="log line format (default: $OUTBOX_LOG_FORMAT, else text on a terminal, json "
        "otherwise)",
    )
    group.add_argument(
        "--log-level",
        default=default,
        help="DEBUG, INFO, WARNING or ERROR (default: $OUTBOX_LOG_LEVEL, else INFO)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OutboxParser(
        prog="outbox",
        description="Transactional outbox and side-effect dispatcher for Spark pipelines.",
        top=True,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def log_format(explicit: str | None, env: Mapping[str, str], stream: TextIO) -> str:
    """The flag, else $OUTBOX_LOG_FORMAT, else text for a person at a terminal, JSON for
    a machine (a pipe, a file, a log collector)."""
    if explicit:
        return explicit
    if env.get("OUTBOX_LOG_FORMAT"):
        return env["OUTBOX_LOG_FORMAT"]
    return "text" if stream.isatty() else "json"


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = _without_password(args.database_url)
    if args.state_dir:
        overrides["state_dir"] = Path(args.state_dir)
    overrides["log_format"] = log_format(args.log_format, os.environ, sys.stderr)
    if args.log_level:
        overrides["log_level"] = args.log_level
    return Settings.from_env(**overrides)


def _without_password(url: str) -> str:
    """Refuse a password on the command line: ``ps`` and /proc show every process's
    arguments to every user, while its environment is private to its owner."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"--database-url: {exc}") from None
    if parsed.password or "password" in parsed.query:
        raise ConfigurationError(
            "--database-url carries a password, which ps shows to every user of this "
            "machine; put the URL in DATABASE_URL instead, or leave the password out of "
            "the URL and give it in PGPASSWORD or ~/.pgpass"
        )
    return url


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        logs.configure(settings.log_level, settings.log_format)
        extras.require(getattr(args, "extras", ()), _command_line(parser, args))
        # A command that meets an unreachable database says so in one line, whichever
        # command it is (five once ended in the driver's traceback).
        with db.translated():
            return int(args.handler(args, settings) or 0)
    except OutboxError as exc:
        print(f"outbox: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def _command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``outbox api serve``: the command and its action, as typed."""
    words = [parser.prog, args.command]
    action = next((v for k, v in vars(args).items() if k.endswith("_command") and v), None)
    return " ".join([*words, action] if action else words)


def _closed_pipe() -> int:
    """The reader went away (``outbox db sql | head``): stop quietly. Python would
    report the failed flush at exit, so stdout is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return CLOSED_PIPE_EXIT


if __name__ == "__main__":
    raise SystemExit(main())
