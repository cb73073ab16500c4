"""Named SQL statements kept in ``.sql`` files beside the code that runs them.

A file holds blocks introduced by ``-- name: <name>``; the comment lines right
after the name say why the statement exists. Loaded once, run through ``text()``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import sqlalchemy as sa

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@functools.cache
def load(path: str | Path) -> dict[str, sa.TextClause]:
    text = Path(path).read_text()
    parts = _NAME.split(text)
    queries: dict[str, sa.TextClause] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = body.strip()
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        queries[name] = sa.text(sql)
    return queries


def queries_beside(module_file: str, filename: str) -> dict[str, sa.TextClause]:
    return load(Path(module_file).with_name(filename))
