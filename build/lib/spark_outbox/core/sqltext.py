"""Named SQL statements as plain text: the parser behind ``spark_outbox.core.sqlfile``.

Plain strings, no SQLAlchemy: Spark executors load their statements with it
and run them through psycopg2 (an import-linter contract keeps them light).
A file holds blocks introduced by ``-- name: <name>``; the comment lines right
after the name say why the statement exists.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@functools.cache
def load(path: str | Path) -> dict[str, str]:
    parts = _NAME.split(Path(path).read_text())
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def beside(module_file: str, filename: str) -> dict[str, str]:
    return load(Path(module_file).with_name(filename))
