"""Named SQL statements kept in ``.sql`` files beside the code that runs them.

A file holds blocks introduced by ``-- name: <name>``; the comment lines right
after the name say why the statement exists. Loaded once, run through ``text()``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa

from spark_outbox.core import sqltext


@functools.cache
def load(path: str | Path) -> dict[str, sa.TextClause]:
    return {name: sa.text(sql) for name, sql in sqltext.load(path).items()}


def queries_beside(module_file: str, filename: str) -> dict[str, sa.TextClause]:
    return load(Path(module_file).with_name(filename))
