"""``outbox``: one console script, one subcommand per area.

Each ``*_cmd`` module exposes ``register(subparsers)``; handlers receive the
parsed arguments and the process's one ``Settings`` and return an exit code.
Signals and logging are set up here, at the entry point, and nowhere else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from dispatcher import logs
from dispatcher.errors import OutboxError
from dispatcher.settings import Settings

COMMAND_MODULES = [
    "outbox.db_cmd",
    "outbox.demo_cmd",
    "outbox.receiver_cmd",
    "outbox.dispatcher_cmd",
    "outbox.endpoints_cmd",
    "outbox.api_cmd",
    "outbox.tokens_cmd",
    "outbox.purge_cmd",
    "outbox.reconcile_cmd",
    "outbox.spark_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox",
        description="Transactional outbox and side-effect dispatcher for Spark pipelines.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: $DATABASE_URL, else a private cluster under --state-dir)",
    )
    parser.add_argument(
        "--state-dir", help="local state directory (default: $OUTBOX_STATE_DIR or .outbox)"
    )
    parser.add_argument("--log-format", choices=["json", "text"], help="log line format")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    if args.state_dir:
        from pathlib import Path

        overrides["state_dir"] = Path(args.state_dir)
    if args.log_format:
        overrides["log_format"] = args.log_format
    if args.log_level:
        overrides["log_level"] = args.log_level
    return Settings.from_env(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        logs.configure(settings.log_level, settings.log_format)
        return int(args.handler(args, settings) or 0)
    except OutboxError as exc:
        print(f"outbox: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
