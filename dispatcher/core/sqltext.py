"""Named SQL statements as plain text: the parser behind ``spark_outbox.core.sqlfile``.

Plain strings, no SQLAlchemy: Spark executors load their statements with it
and run them through psycopg2 (an import-linter contract keeps them light).
A file holds blocks introduced by ``-- name: <name>``; the comment lines right
after the name say why the statement exists. The package may be imported from a
zip (executors given it by ``spark-submit --py-files``, see
``spark_outbox.spark.shipping``): a file beside a module is then read through the
zip's importer, as the module itself was.
"""

from __future__ import annotations

import functools
import re
import zipimport
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@functools.cache
def load(path: str | Path) -> dict[str, str]:
    parts = _NAME.split(_read(Path(path)))
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        queries[name] = without_comments(body).strip()
    return queries


def without_comments(sql: str) -> str:
    """``sql`` less its ``--`` and ``/* */`` comments (a line comment's newline kept),
    string literals, quoted names and dollar-quoted bodies untouched.

    The comments say why a statement is written as it is, and name its parameters
    (``:limit``); SQLAlchemy's ``text()`` binds a ``:name`` wherever it stands, and
    psycopg2 puts the value in place, inside a comment too: a value with a newline
    then ended the comment and the rest of it was SQL (an actor filter of the audit
    trail, typed by any support user, could inject a statement). Without comments a
    parameter is only ever where the statement uses it."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end  # the newline itself is kept
        elif c == "/" and sql.startswith("/*", i):
            depth, i = 1, i + 2  # PostgreSQL's block comments nest
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif c in "'\"":
            end = i + 1
            while end < n:  # a doubled quote is one quote inside
                if sql[end] == c and sql.startswith(c * 2, end):
                    end += 2
                elif sql[end] == c:
                    break
                else:
                    end += 1
            out.append(sql[i : end + 1])
            i = end + 1
        elif c == "$" and (tag := _DOLLAR.match(sql, i)) and (i == 0 or not _word(sql[i - 1])):
            end = sql.find(tag.group(0), tag.end())
            end = n if end < 0 else end + len(tag.group(0))
            out.append(sql[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


_DOLLAR = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def beside(module_file: str, filename: str) -> dict[str, str]:
    return load(Path(module_file).with_name(filename))


def _read(path: Path) -> str:
    """The file's text; inside a zip on ``sys.path``, read from that zip (a path
    there names the archive and then the member: ``.../pkg.zip/spark_outbox/x.sql``)."""
    if path.is_file():
        return path.read_text()
    for archive in path.parents:
        if archive.is_file():
            data: bytes = zipimport.zipimporter(str(archive)).get_data(str(path))
            return data.decode()
    return path.read_text()  # the usual FileNotFoundError naming the path
