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
        queries[name] = body.strip()
    return queries


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
