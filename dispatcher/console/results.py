"""Reconciliation of a batch's result rows: what it wrote against what its results
table holds now, row by row, by content.

The sink's commit records every result row it applies (its conflict key and the
digest of the columns it wrote, as they stood after the merge: ``batch_result_rows``,
spark_outbox.core.resultrows), and the marker names the table, its keys, the
columns and the batch-stamp columns if the job declared them
(``ResultsSpec.batch_columns``). Here each recorded row is looked up in the table:

- ``as_written``: it holds what the batch wrote;
- ``overwritten``: it holds something else, and a later batch of the same table
  wrote that key (``apply="overwrite"``, or ``"add"``): what this batch wrote can no
  longer be compared; the later batch's reconciliation checks what is there now;
- ``changed``: something else, and no later batch wrote it: unexplained;
- ``missing``: the key is gone: unexplained;
- ``foreign`` (only with batch-stamp columns): a row stamped with this batch that
  it did not write: unexplained.

Every unexplained row is named by its key (the first ``NAMED`` of each category),
never only counted, so one missing and one foreign row cannot cancel out. Memory
is bounded: the recorded rows are read in chunks in key order, each chunk joined
to the table in SQL (its unique index), and the foreign rows are found by a keyset
walk of the batch's stamped rows; nothing reads the table into Python.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.core import resultrows
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "results.sql")
CHUNK = 1000
NAMED = 20  # keys named per category; the count is always whole

MEANINGS = {
    "as_written": (True, "the table holds what the batch wrote"),
    "overwritten": (
        True,
        "a later batch wrote the same key (overwrite or add): what this batch wrote is no "
        "longer there to compare; that batch's reconciliation checks it",
    ),
    "changed": (
        False,
        "the table holds other values than the batch wrote, and no later batch wrote this key",
    ),
    "missing": (False, "the batch wrote this row; the table no longer holds its key"),
    "foreign": (False, "stamped with this batch (its job and batch id columns), not written by it"),
}


@dataclasses.dataclass(frozen=True)
class ResultLine:
    category: str
    count: int
    explained: bool
    meaning: str
    keys: list[dict[str, Any]]  # the first NAMED conflict keys of the category


@dataclasses.dataclass(frozen=True)
class ResultsCheck:
    table: str | None
    recorded: int  # result rows the batch recorded writing
    lines: list[ResultLine]
    cannot_know: list[str]  # what this check cannot tell, and why

    @property
    def unexplained(self) -> int:
        return sum(line.count for line in self.lines if not line.explained)


def check(conn: Connection, marker: Mapping[str, Any]) -> ResultsCheck:
    """The result rows of the batch whose marker row is ``marker``."""
    table = marker["results_table"]
    if table is None:
        note = [] if not marker["result_rows"] else [_NOT_RECORDED]
        return ResultsCheck(None, 0, [], note)
    recorded = int(conn.execute(_Q["recorded_count"], {"batch_ref": marker["id"]}).scalar_one())
    try:
        q = resultrows.checked(
            conn,
            table,
            marker["result_keys"],
            marker["result_columns"],
            marker["result_stamp"] or (),
        )
    except ConfigurationError as exc:
        return ResultsCheck(table, recorded, [], [f"cannot re-read the results table: {exc}"])
    resultrows.pin_settings(conn)
    found = _Found()
    _compare(conn, q, marker, found)
    notes = [] if recorded or not marker["result_rows"] else [_NOT_RECORDED]
    if marker["result_stamp"]:
        _foreign(conn, q, marker, found)
    else:
        notes.append(_NO_STAMP)
    if found.counts.get("overwritten"):
        notes.append(_OVERWRITTEN)
    return ResultsCheck(table, recorded, found.lines(), notes)


_NOT_RECORDED = (
    "the batch has no record of its result rows (committed before they were recorded, "
    "or retention dropped the record): they cannot be compared with the table"
)
_NO_STAMP = (
    "the results table has no batch columns (ResultsSpec.batch_columns): rows the batch "
    "did not write cannot be attributed to it, so foreign rows are not looked for"
)
_OVERWRITTEN = (
    "rows a later batch wrote again: whether this batch's values ever stood there cannot "
    "be told any more; a row deleted and written back with the same values reads as written"
)


@dataclasses.dataclass
class _Found:
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    named: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def add(self, category: str, key: Any) -> None:
        self.counts[category] = self.counts.get(category, 0) + 1
        named = self.named.setdefault(category, [])
        if len(named) < NAMED and category != "as_written":
            named.append(key if isinstance(key, dict) else json.loads(key))

    def lines(self) -> list[ResultLine]:
        return [
            ResultLine(name, self.counts.get(name, 0), explained, meaning, self.named.get(name, []))
            for name, (explained, meaning) in MEANINGS.items()
            if self.counts.get(name) or explained
        ]


def _compare(
    conn: Connection, q: resultrows.Quoted, marker: Mapping[str, Any], found: _Found
) -> None:
    """Every recorded row, a chunk at a time in key order."""
    statement = sa.text(
        _Q["compare_chunk_template"].text.format(
            table=q.table,
            first_key=q.keys[0],
            digest=q.digest("t"),
            t_keys=", ".join(f"t.{k}" for k in q.keys),
            k_keys=", ".join(f"k.{k}" for k in q.keys),
        )
    )
    params = {"batch_ref": marker["id"], "results_table": marker["results_table"], "chunk": CHUNK}
    after: str | None = None
    while True:
        rows = conn.execute(statement, params | {"after": after}).all()
        for key, category in rows:
            found.add(category, key)
        if len(rows) < CHUNK:
            return
        after = json.dumps(rows[-1][0])


def _foreign(
    conn: Connection, q: resultrows.Quoted, marker: Mapping[str, Any], found: _Found
) -> None:
    """Rows stamped with the batch that it did not write, a chunk at a time."""
    quote = conn.dialect.identifier_preparer.quote
    job_column, batch_column = marker["result_stamp"]
    statement = sa.text(
        _Q["foreign_chunk_template"].text.format(
            table=q.table,
            key=q.key_object("t"),
            job_column=quote(job_column),
            batch_column=quote(batch_column),
            t_keys=", ".join(f"t.{k}" for k in q.keys),
            a_keys=", ".join(f"a.{k}" for k in q.keys),
        )
    )
    params = {
        "batch_ref": marker["id"],
        "job": marker["job"],
        "batch_id": marker["batch_id"],
        "chunk": CHUNK,
    }
    after: str | None = None
    while True:
        rows = conn.execute(statement, params | {"after": after}).all()
        for (key,) in rows:
            found.add("foreign", key)
        if len(rows) < CHUNK:
            return
        after = json.dumps(rows[-1][0])
