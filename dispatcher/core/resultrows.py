"""A result row as the sink's commit records it and reconciliation re-reads it: its
conflict key (a JSON object of the key columns) and a digest of the columns the
batch wrote. One definition for both sides (spark_outbox.spark.results writes
``batch_result_rows``, spark_outbox.console.results compares with the table now).

The digest is the sha256 of the text of ``ROW(col, ...)``, and a value's text
depends on session settings (a timestamptz is printed in the session's time zone),
so both sides pin them first (``pin_settings``, for their transaction only).
Identifiers come from the job's configuration or from the batch marker; they are
checked against the catalog (``checked``) and quoted before they go into a
statement, as the results merge always did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.core.errors import ConfigurationError

# Every setting a value's text output depends on, pinned for the transaction.
_PINNED = (
    "SET LOCAL TimeZone TO 'UTC'",
    "SET LOCAL DateStyle TO 'ISO, YMD'",
    "SET LOCAL IntervalStyle TO 'postgres'",
    "SET LOCAL extra_float_digits TO 1",
    "SET LOCAL bytea_output TO 'hex'",
)
_COLUMNS = sa.text(
    "SELECT attname FROM pg_attribute"
    " WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped"
)


def pin_settings(conn: Connection) -> None:
    """The settings the digest's text depends on, for the current transaction."""
    for statement in _PINNED:
        conn.execute(sa.text(statement))


@dataclasses.dataclass(frozen=True)
class Quoted:
    """A results table's identifiers, checked against the catalog and quoted."""

    table: str
    keys: tuple[str, ...]  # quoted conflict-key columns
    columns: tuple[str, ...]  # quoted columns the batch writes
    names: tuple[str, ...]  # the key columns' plain names (the JSON object's keys)

    def key_object(self, alias: str) -> str:
        """``jsonb_build_object('k', t."k", ...)`` over ``alias``'s key columns."""
        pairs = (f"{_literal(n)}, {alias}.{q}" for n, q in zip(self.names, self.keys, strict=True))
        return f"jsonb_build_object({', '.join(pairs)})"

    def digest(self, alias: str) -> str:
        """The hex sha256 of ``alias``'s written columns (pin the settings first)."""
        row = ", ".join(f"{alias}.{c}" for c in self.columns)
        return f"encode(sha256(convert_to(CAST(ROW({row}) AS text), 'UTF8')), 'hex')"


def checked(
    conn: Connection,
    table: str,
    keys: Sequence[str],
    columns: Sequence[str],
    also: Sequence[str] = (),
) -> Quoted:
    """``table``'s identifiers quoted, once each is known to exist (else
    ``ConfigurationError`` naming the one that does not); ``also``: more names
    that must exist."""
    known = {r[0] for r in conn.execute(_COLUMNS, {"table": table})}
    if not known:
        raise ConfigurationError(f"results table {table!r} does not exist")
    for name in (*keys, *columns, *also):
        if name not in known:
            raise ConfigurationError(
                f"column {name!r} is not in results table {table!r} (has {sorted(known)})"
            )
    quote = conn.dialect.identifier_preparer.quote
    return Quoted(
        table=".".join(quote(part) for part in table.split(".")),
        keys=tuple(quote(k) for k in keys),
        columns=tuple(quote(c) for c in columns),
        names=tuple(keys),
    )


def _literal(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"
