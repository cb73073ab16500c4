"""How result rows are applied to any results table (the SQL templates are in commit.sql).

Rows arrive as jsonb (``staged_results.row``) and are turned into the table's
row type with ``jsonb_populate_record``, so the sink needs no per-table code.
Identifiers come from the job's configuration; they are checked against the
catalog and quoted before they go into the statement (spark_outbox.core.resultrows).
Every row applied is recorded for the batch in the same statement (its key and the
digest of what the table then holds: ``batch_result_rows``), so reconciliation can
re-read the table later (spark_outbox.console.results).
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.core import resultrows
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "commit.sql")
APPLY_MODES = ("overwrite", "add")


@dataclasses.dataclass(frozen=True)
class ResultsSpec:
    """Where result rows go and how: ``overwrite`` replaces the stored values of a
    row with the same conflict key; ``add`` adds ``add_columns`` to the stored
    values (counters, amounts) and overwrites the other columns."""

    table: str
    conflict_keys: tuple[str, ...]
    apply: str = "overwrite"
    add_columns: tuple[str, ...] = ()
    # Columns of the table holding the job and the batch id that wrote each row (the
    # billing example's ``("job", "batch_id")``), if it has such: reconciliation then
    # also finds rows stamped with a batch that the batch did not write (foreign).
    batch_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.apply not in APPLY_MODES:
            raise ConfigurationError(f"apply={self.apply!r}: use one of {APPLY_MODES}")
        if not self.conflict_keys:
            raise ConfigurationError(
                f"results table {self.table}: name its conflict-key columns, e.g. ('invoice_id',)"
            )
        if self.apply == "add" and not self.add_columns:
            raise ConfigurationError("apply='add': name the add_columns to sum, e.g. ('amount',)")
        if self.batch_columns and len(self.batch_columns) != 2:
            raise ConfigurationError(
                f"batch_columns={self.batch_columns!r}: name the job column and the batch id "
                "column, e.g. ('job', 'batch_id')"
            )


# The staged rows a merge reads: those of the tasks that succeeded, or one slice of
# one task's rows in physical order (spark_outbox.spark.result_rejects bisects with it).
SUCCEEDED_TASKS = "s.task_id = ANY(:task_ids)"
ONE_SLICE = "s.task_id = :task_id AND s.ctid BETWEEN CAST(:first AS tid) AND CAST(:last AS tid)"


@dataclasses.dataclass(frozen=True)
class TableShape:
    """What the catalog says of the results table: its columns, which are NOT NULL,
    and which of those have no default (a results DataFrame must carry them)."""

    columns: frozenset[str]
    not_null: frozenset[str]
    required: frozenset[str]


def table_shape(conn: Connection, spec: ResultsSpec) -> TableShape:
    found = list(conn.execute(_Q["results_columns"], {"table": spec.table}))
    if not found:
        raise ConfigurationError(f"results table {spec.table!r} does not exist")
    return TableShape(
        columns=frozenset(r[0] for r in found),
        not_null=frozenset(r[0] for r in found if r[1]),
        required=frozenset(r[0] for r in found if r[2]),
    )


def apply_statement(
    conn: Connection, spec: ResultsSpec, columns: tuple[str, ...], rows: str = SUCCEEDED_TASKS
) -> sa.TextClause:
    """The INSERT ... ON CONFLICT statement for ``columns`` of the results DataFrame,
    reading the staged ``rows`` (SUCCEEDED_TASKS or ONE_SLICE) and recording every
    row it applies for the batch ``:batch_ref``; it returns the count applied (pin
    the digest's settings first: ``resultrows.pin_settings``)."""
    shape = table_shape(conn, spec)
    missing_keys = set(spec.conflict_keys) - set(columns)
    if missing_keys:
        raise ConfigurationError(
            f"the results DataFrame lacks conflict keys {sorted(missing_keys)}"
        )
    missing = shape.required - set(columns)
    if missing:
        raise ConfigurationError(
            f"the results DataFrame lacks column(s) {sorted(missing)} of {spec.table!r}, "
            "NOT NULL without a default: every row would be refused; add them"
        )
    also = (*spec.add_columns, *spec.batch_columns)
    q = resultrows.checked(conn, spec.table, spec.conflict_keys, columns, also)
    table, quote = q.table, conn.dialect.identifier_preparer.quote
    updates = [c for c in columns if c not in spec.conflict_keys]
    assignments = [
        f"{quote(c)} = {table}.{quote(c)} + EXCLUDED.{quote(c)}"
        if c in spec.add_columns
        else f"{quote(c)} = EXCLUDED.{quote(c)}"
        for c in updates
    ]
    # Only conflict keys: nothing to update, so the statement without DO UPDATE SET
    # (a key already there is kept, and recorded as the batch's from its staged row).
    template = _Q["apply_results_template" if assignments else "insert_results_template"].text
    sql = template.format(
        table=table,
        columns=", ".join(q.columns),
        record_columns=", ".join(f"r.{c}" for c in q.columns),
        conflict_keys=", ".join(q.keys),
        assignments=", ".join(assignments),
        rows=rows,
        key=q.key_object(table),
        digest=q.digest(table),
        staged_key=q.key_object("r"),
        staged_digest=q.digest("r"),
    )
    return sa.text(sql)
