"""Hot-path statements prepared once per connection, their plans kept and refreshed.

Prepared here, as ``store.Statements`` decides: the claim after a short one
(``store.claim``) and the record (``store.record``, always: at 1,000 effects/s
it was ~0.7 ms planning per call beside 0.5-1 ms executing).

Why: at a low rate the claim is planning, not work. At 1,000 effects/s (one
dispatcher process, ~5 effects per claim) pg_stat_statements measured 1.31 ms
planning and 0.51 ms executing per claim; with two processes the claims alone
took 65 % of one core. A prepared statement plans once; PostgreSQL then runs its
generic plan when it estimates it no dearer than the custom ones
(``plan_cache_mode = auto``). Estimates, not costs: the second trap below was a
generic plan PostgreSQL chose.

Two traps, both measured (bench/RESULTS.md, "a claim planned once"):

- A ``LIMIT`` given as a parameter makes the generic plan guess 10 % of the
  table: the claim's final UPDATE then hash-joined a sequential scan of
  ``effects`` (7.7 ms per claim at 30,000 due rows against 1.6 ms unprepared).
  So the limit is written into the statement, one statement per size; the
  store rounds its claims' sizes down a little (``size_of``), so a
  connection holds a few (at most ``_MAX_PER_CONNECTION``, then all are dropped).
- A plan is built with the table sizes of its moment, and PostgreSQL replans
  only after ANALYZE (autovacuum looks once a minute) or TRUNCATE. A claim plan
  made while ``effects`` held ~350 rows hash-joined a sequential scan of it
  once the table had grown to 8,800 (4-5 ms per claim instead of 0.5). So a plan
  lives ``max_age_s`` (1 s): one planning a second per connection instead of one
  per claim (hundreds a second), and a table that grows tenfold at once (a
  million-row batch commit) costs slower claims for at most that second.

Behind a PgBouncer in transaction pooling mode a prepared statement may not be on
the server connection that runs it: set ``OUTBOX_PREPARED_STATEMENTS=0``. A
statement found missing (a server-side ``DISCARD ALL``) is prepared again once.

Which statements are prepared, at which claim sizes, is decided in one place:
``store.Statements`` (made from the settings); this module is the mechanism it
runs. A statement's text is the one in its ``.sql`` file: SQLAlchemy's compiler
(the one that runs it unprepared) numbers its parameters ``$1, $2, ...`` and
writes in the values bound as literals (the claim's LIMIT); nothing here edits
SQL text.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

# Parameters numbered $1, $2, ... (PREPARE's form), a repeated one keeping its number.
_DOLLAR = PGDialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
_MISSING = "26000"  # invalid_sql_statement_name: "prepared statement ... does not exist"
_INFO_KEY = "outbox_prepared_at"
_MAX_PER_CONNECTION = 32
# A claim's prepared sizes come in eighths of a batch (``size_of``), and a claim
# that returned less than an eighth is "short" (``is_short``): one fraction, so
# ``store.Statements``, turning to prepared claims after a short one, never asks
# for a size between the steps.
EIGHTHS = 8


@dataclasses.dataclass(frozen=True)
class Statement:
    """``sql`` with ``:name`` parameters, each given a PostgreSQL type in ``types``;
    a parameter bound with ``literal_execute=True`` and a value is written into the
    statement instead (``literal``)."""

    name: str
    sql: str | sa.TextClause
    types: Mapping[str, str]
    max_age_s: float = 1.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", self.name):
            raise ValueError(f"prepared statement name {self.name!r}: use [a-z0-9_]")
        missing = set(self.order) - set(self.types)
        if missing:
            raise ValueError(f"{self.name}: no type for parameter(s) {sorted(missing)}")

    @functools.cached_property
    def _compiled(self) -> tuple[str, tuple[str, ...]]:
        """The body with $n parameters, and their names in the order of first use."""
        clause = sa.text(self.sql) if isinstance(self.sql, str) else self.sql
        compiled = clause.compile(dialect=_DOLLAR)
        # Literals are written in at expansion; the other parameters keep their $n.
        literals = {bind.key for bind in compiled.literal_execute_params}
        names = [name for name in compiled.positiontup or () if name not in literals]
        expanded = compiled.construct_expanded_state(dict.fromkeys(names))
        return expanded.statement, tuple(expanded.positiontup or ())

    @property
    def order(self) -> tuple[str, ...]:
        """The parameters in the order of their first use ($1, $2, ...). Cached: the
        claim is compiled once per size, not on every claim."""
        return self._compiled[1]

    def prepare_sql(self) -> str:
        types = ", ".join(self.types[name] for name in self.order)
        return f"PREPARE {self.name} ({types}) AS {self._compiled[0]}"

    @functools.cached_property
    def execute_sql(self) -> str:
        return f"EXECUTE {self.name} ({', '.join(['%s'] * len(self.order))})"


def literal(clause: sa.TextClause, **values: int) -> sa.TextClause:
    """``clause`` with these parameters written into the statement when it is
    compiled (PostgreSQL plans a literal LIMIT, not a guess), by SQLAlchemy's compiler."""
    return clause.bindparams(
        *(sa.bindparam(name, value, literal_execute=True) for name, value in values.items())
    )


def is_short(claimed: int, ceiling: int) -> bool:
    """Did a claim that returned ``claimed`` rows (``ceiling``: the batch size) find
    little due? Less than an eighth of a batch; for a batch under 8, nothing."""
    return claimed * EIGHTHS < ceiling


def size_of(limit: int, ceiling: int) -> int:
    """The statement size for a claim of up to ``limit`` (``ceiling``: the batch size):
    ``limit`` rounded down to an eighth of the ceiling, or below that to a power of
    two. At most ~13 statements per connection, and a claim never shrinks by more
    than an eighth of a batch (rounding to powers of two cost 8 % of the throughput
    with two processes: claims of 128 where 190 had room)."""
    if limit >= ceiling:
        return ceiling
    step = max(1, ceiling // EIGHTHS)
    if limit >= step:
        return limit // step * step
    return 1 << (max(1, limit).bit_length() - 1)


def lost(exc: DBAPIError) -> bool:
    """Did the server not know the prepared statement (``DISCARD ALL``)?"""
    return getattr(exc.orig, "pgcode", None) == _MISSING


def execute(
    conn: Connection, statement: Statement, values: Mapping[str, Any], *, retry_lost: bool = True
) -> Any:
    """Run ``statement`` prepared on ``conn``'s connection (preparing it first when it
    is new there or older than its ``max_age_s``); its result. The retry after a lost
    statement needs an autocommit connection (the dispatcher's engine): inside a
    transaction the failed EXECUTE has already aborted it, so there pass
    ``retry_lost=False``: the statement is forgotten (prepared again next time) and
    the error raised, for the caller to run its transaction again (``lost``)."""
    prepared: dict[str, float] = conn.connection.info.setdefault(_INFO_KEY, {})
    params = tuple(values[name] for name in statement.order)
    for last_try in (False, True):
        at = prepared.get(statement.name)
        if at is None and len(prepared) >= _MAX_PER_CONNECTION:
            conn.exec_driver_sql("DEALLOCATE ALL")
            prepared.clear()
        if at is None or time.monotonic() - at > statement.max_age_s:
            if at is not None:
                _deallocate(conn, statement.name)
            conn.exec_driver_sql(statement.prepare_sql())
            prepared[statement.name] = time.monotonic()
        try:
            return conn.exec_driver_sql(statement.execute_sql, params)
        except DBAPIError as exc:
            if not lost(exc):
                raise
            prepared.pop(statement.name, None)  # gone from the server: prepare again
            if last_try or not retry_lost:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _deallocate(conn: Connection, name: str) -> None:
    try:
        conn.exec_driver_sql(f"DEALLOCATE {name}")
    except DBAPIError as exc:
        if getattr(exc.orig, "pgcode", None) != _MISSING:
            raise
