"""``outbox effects lookup``: many keys at once, as a report or a ticket lists them.

Each argument (or line of ``--file``, ``-`` for stdin) is a key or its start as
reports print it (``13dd1f9d44fa…``, at least 8 hex characters); one query
answers all of them (``spark_outbox.console.lists.lookup``), one line each, in
the order given. Exit status 1 when any names no effect, or several.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.cli import output
from spark_outbox.cli.database import engine_for
from spark_outbox.console import lists
from spark_outbox.core.errors import ConfigurationError, Conflict, NotFound
from spark_outbox.core.settings import Settings

COLUMNS = ("asked", "state", "endpoint", "recipient", "reference", "attempts", "delivered_at")


def register(cmds: Any) -> None:
    p = cmds.add_parser(
        "lookup", help="many keys (or their starts, 13dd1f9d44fa…) at once: one line each"
    )
    p.add_argument("keys", nargs="*", help="keys or key prefixes (8+ hex characters)")
    p.add_argument(
        "--file", help="read them from this file too, one a line (- for stdin; default: none)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per key, per line")
    p.set_defaults(handler=lookup)


def lookup(args: argparse.Namespace, settings: Settings) -> int:
    asked = [*args.keys, *_read(args.file)]
    if not asked:
        raise ConfigurationError("lookup: give keys as arguments or with --file PATH (- for stdin)")
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            found = lists.lookup(conn, asked)
    finally:
        engine.dispose()
    if args.json:
        for f in found:
            print(output.dumps({"asked": f.asked, "problem": f.problem, "effects": f.effects}))
    else:
        output.table((*COLUMNS, "idempotency_key"), (row for f in found for row in _rows(f)))
    missing = [f for f in found if len(f.effects) != 1]
    if missing:
        print(f"{len(missing)} of {len(found)} named no effect, or several", file=sys.stderr)
    return 1 if missing else 0


# Room for MAX_LOOKUP keys as reports print them, with room to spare; a larger file is
# refused, not read whole (``--file /dev/zero`` once never returned).
MAX_FILE_BYTES = 1 << 20


def _read(path: str | None) -> list[str]:
    if path is None:
        return []
    where = "standard input" if path == "-" else repr(path)
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with Path(path).open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"--file: cannot read {where} ({exc.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigurationError(
            f"--file: {where} holds more than {MAX_FILE_BYTES // 1024} KiB; look up at most "
            f"{lists.MAX_LOOKUP} keys at a time"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigurationError(
            f"--file: {where} is not UTF-8 text; give one key (or its start) a line"
        ) from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _rows(found: lists.Found) -> list[tuple[object, ...]]:
    if found.problem or not found.effects:
        why = found.problem or "no effect"
        return [(found.asked, why, "", "", "", "", "", "")]
    state = "ambiguous: " if len(found.effects) > 1 else ""
    return [
        (
            found.asked,
            state + e["state"] + (" (purged)" if e["purged_at"] else ""),
            e["endpoint"],
            e["recipient"],
            e["reference"],
            e["attempt_count"],
            e["delivered_at"],
            e["idempotency_key"],
        )
        for e in found.effects
    ]


def one_key(conn: Connection, text: str) -> str:
    """The key ``text`` names: itself, or the one effect whose key starts with it."""
    (found,) = lists.lookup(conn, [text])
    if found.problem:
        raise NotFound(f"{text!r} is {found.problem}")
    if not found.effects and len(text) == 64:
        return text  # effect_detail says what the key ledger knows of it, if anything
    if not found.effects:
        raise NotFound(f"no effect's key starts with {text!r}")
    if len(found.effects) > 1:
        keys = ", ".join(e["idempotency_key"] for e in found.effects)
        raise Conflict(f"{text!r} starts more than one key ({keys}, ...): give more of it")
    return str(found.effects[0]["idempotency_key"])
