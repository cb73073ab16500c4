"""How commands print what they found: an aligned table for people, JSON for programs.

JSON goes through the API's own response models, so ``outbox effects list --json``
and ``GET /v1/effects`` print the same fields in the same formats (instants as
``spark_outbox.core.timestamps.iso``). A closed stdout (``| head``) is handled by the
entry point.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from spark_outbox.core.outside import one_line
from spark_outbox.core.timestamps import iso


def cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, dict | list):
        return compact(value)
    # Other controls escaped: a name stored before names were checked, or a receiver's
    # text, must not move the cursor or recolour the operator's terminal.
    return one_line(str(value).replace("\n", " "))


def compact(value: object) -> str:
    """JSON on one line, as stored (not Python's repr)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=plain)


def plain(value: object) -> str:
    """``json.dumps``'s ``default`` for the CLI: instants as ``iso``, the rest as text."""
    return iso(value) if isinstance(value, dt.datetime) else str(value)


def dumps(value: object) -> str:
    """JSON for a command's ``--json`` output (instants in the one format)."""
    return json.dumps(value, default=plain)


def table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Columns padded to their widest cell; the last column is not padded."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    for row in [list(columns), *cells]:
        padded = [v.ljust(w) for v, w in zip(row[:-1], widths, strict=False)]
        print("  ".join([*padded, row[-1]]).rstrip())


def as_json(model: type[Any], value: object) -> None:
    """``value`` (a read-model dataclass) printed through the API schema ``model``."""
    print(model.model_validate(value).model_dump_json())


def more(next_cursor: str | None) -> None:
    if next_cursor:
        print(f"(more: add --cursor {next_cursor})", file=sys.stderr)
