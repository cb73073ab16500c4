"""How result rows are applied to any results table (the SQL templates are in commit.sql).

Rows arrive as jsonb (``staged_results.row``) and are turned into the table's
row type with ``jsonb_populate_record``, so the sink needs no per-table code.
Identifiers come from the job's configuration; they are checked against the
catalog and quoted before they go into the statement.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

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

    def __post_init__(self) -> None:
        if self.apply not in APPLY_MODES:
            raise ConfigurationError(f"apply={self.apply!r}: use one of {APPLY_MODES}")
        if not self.conflict_keys:
            raise ConfigurationError(
                f"results table {self.table}: name its conflict-key columns, e.g. ('invoice_id',)"
            )
        if self.apply == "add" and not self.add_columns:
            raise ConfigurationError("apply='add': name the add_columns to sum, e.g. ('amount',)")


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
    reading the staged ``rows`` (SUCCEEDED_TASKS or ONE_SLICE)."""
    shape = table_shape(conn, spec)
    for name in (*columns, *spec.conflict_keys, *spec.add_columns):
        if name not in shape.columns:
            raise ConfigurationError(
                f"column {name!r} is not in results table {spec.table!r} "
                f"(has {sorted(shape.columns)})"
            )
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
    quote = conn.dialect.identifier_preparer.quote
    table = ".".join(quote(part) for part in spec.table.split("."))
    updates = [c for c in columns if c not in spec.conflict_keys]
    assignments = [
        f"{quote(c)} = {table}.{quote(c)} + EXCLUDED.{quote(c)}"
        if c in spec.add_columns
        else f"{quote(c)} = EXCLUDED.{quote(c)}"
        for c in updates
    ]
    # Only conflict keys: nothing to update, so the statement without DO UPDATE SET.
    template = _Q["apply_results_template" if assignments else "insert_results_template"].text
    sql = template.format(
        table=table,
        columns=", ".join(quote(c) for c in columns),
        record_columns=", ".join(f"r.{quote(c)}" for c in columns),
        conflict_keys=", ".join(quote(c) for c in spec.conflict_keys),
        assignments=", ".join(assignments),
        rows=rows,
    )
    return sa.text(sql)
