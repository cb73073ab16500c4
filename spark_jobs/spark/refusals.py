"""Why the results table refused a row, in words that name the column and the fix.

A refused row's reason starts with ``table.column:`` as an effect reject's starts
with its field; the value may be quoted (as in effect rejects), never more than
a short excerpt of PostgreSQL's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

if TYPE_CHECKING:
    from spark_outbox.spark.commit import CommitRequest

_Q = queries_beside(__file__, "result_rejects.sql")
MESSAGE_CHARS = 200
# What breaking each kind of constraint means, and what to do about it.
_BROKEN = {
    "23514": "fails {name}: {definition}; fix the value in the job",
    "23503": "has no match for {name}: {definition}; write the referenced row first",
    "23505": "repeats a stored row's value under {name}: {definition}",
}


def sqlstate(exc: sa.exc.DBAPIError) -> str:
    return str(getattr(exc.orig, "pgcode", None) or "")


def null_reason(table: str, column: str) -> str:
    return (
        f"{table}.{column}: null, but the column is NOT NULL; set it in the job, "
        "or leave the row out of the results"
    )


def reject_fields(request: CommitRequest) -> dict[str, Any]:
    return {"job": request.job, "batch_id": request.batch_id, "run_id": request.run_id}


def reject_row(
    conn: Connection, request: CommitRequest, task_id: int, ctid: str, exc: Exception
) -> str:
    """The single staged row at ``ctid`` was refused with ``exc``: into rejects, with
    the reason (returned)."""
    params = {"run_id": request.run_id, "task_id": task_id, "ctid": ctid}
    raw_row = conn.execute(_Q["staged_row"], params).scalar_one()
    reason = _reason(conn, request, raw_row, exc)
    conn.execute(
        _Q["insert_reject"], {**reject_fields(request), "reason": reason, "raw_row": raw_row}
    )
    return reason


def _reason(conn: Connection, request: CommitRequest, raw_row: str, exc: Exception) -> str:
    assert request.results is not None
    table = request.results.table
    code = sqlstate(exc) if isinstance(exc, sa.exc.DBAPIError) else ""
    diag = getattr(getattr(exc, "orig", None), "diag", None)
    message = str(getattr(diag, "message_primary", None) or exc).splitlines()[0]
    message = message[:MESSAGE_CHARS]
    column = getattr(diag, "column_name", None)
    if code == "23502" and column:
        return null_reason(table, str(column))
    name = getattr(diag, "constraint_name", None)
    if code in _BROKEN and name:
        columns, definition = _constraint(conn, table, name)
        return f"{table}.{columns}: " + _BROKEN[code].format(name=name, definition=definition)
    if code.startswith("22"):
        column = _column_refusing(conn, request, raw_row)
        return f"{table}.{column}: {message}; give the column a value of its type"
    return f"{table}: {message}"


def _constraint(conn: Connection, table: str, name: str) -> tuple[str, str]:
    """The constraint's (or unique index's) columns, as ``a`` or ``(a, b)``, and its text."""
    params = {"table": table, "name": name}
    found = conn.execute(_Q["constraint_columns"], params).first()
    found = found or conn.execute(_Q["index_columns"], params).first()
    if found is None:
        return "?", name
    columns = list(found[0])
    shown = columns[0] if len(columns) == 1 else f"({', '.join(columns)})"
    return shown, str(found[1])


def _column_refusing(conn: Connection, request: CommitRequest, raw_row: str) -> str:
    """The first column whose value alone the table's type refuses (each tried under
    a savepoint); ``?`` if none does alone."""
    assert request.results is not None
    quote = conn.dialect.identifier_preparer.quote
    table = ".".join(quote(part) for part in request.results.table.split("."))
    statement = sa.text(_Q["populate_column_template"].text.format(table=table))
    for column in request.result_columns:
        try:
            with conn.begin_nested():
                conn.execute(statement, {"column": column, "raw_row": raw_row})
        except sa.exc.DBAPIError as exc:
            if sqlstate(exc).startswith("22"):
                return column
            raise
    return "?"
