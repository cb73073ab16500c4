"""Result rows the results table refuses become rejects naming the column; the good
rows commit (the contract effect rows have, for the job's own rows).

The merge of a batch's result rows (commit step 5) runs under a savepoint, so a
batch whose rows all fit pays one SAVEPOINT and nothing more: the table itself
is the check (its types, NOT NULLs, CHECKs, foreign keys), never a copy of its
rules that could drift. Only when the merge fails, still inside the commit:

1. rows with a null in a NOT NULL column move to rejects, one statement per
   column (a job bug can null thousands of rows: no bisection for those);
2. the merge is tried again; if rows share a conflict key (a merge can apply
   only one row per key) the batch fails, in one line: that is the job's bug;
3. each task's staged rows are merged in slices, bisected by physical position
   (ctid ranges) down to the single rows refused; each becomes a reject whose
   reason names the column (from the error, the constraint, or by trying the
   row's values one column at a time).

With ``on_invalid="fail"`` the first refused rows end the batch in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.core import resultrows
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.spark import refusals
from spark_outbox.spark.outcome import BatchNotCommitted, InvalidRows
from spark_outbox.spark.results import ONE_SLICE, apply_statement, table_shape

if TYPE_CHECKING:
    from spark_outbox.spark.commit import CommitRequest

_Q = queries_beside(__file__, "result_rejects.sql")
# SQLSTATE classes of a row the table refuses: cardinality, data, integrity.
ROW_ERROR_CLASSES = ("21", "22", "23")
REASONS_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class Merged:
    rows: int = 0  # result rows merged into the table
    rejects: int = 0  # result rows refused, now in rejects
    reasons: tuple[str, ...] = ()  # the first distinct reasons


def merge(
    conn: Connection, request: CommitRequest, task_ids: list[int], *, batch_ref: int
) -> Merged:
    """Merge the staged result rows of ``task_ids``, each row applied recorded for
    the batch ``batch_ref`` (reconciliation re-reads the table with them); refused
    rows become rejects."""
    assert request.results is not None
    resultrows.pin_settings(conn)
    whole = apply_statement(conn, request.results, request.result_columns)
    params = {"run_id": request.run_id, "task_ids": task_ids, "batch_ref": batch_ref}
    first = _attempt(conn, whole, params)
    if isinstance(first, int):
        return Merged(rows=first)
    rejects, reasons = _reject_nulls(conn, request, task_ids)
    _refuse_if_failing(request, reasons)
    again = _attempt(conn, whole, params)
    if isinstance(again, int):
        return Merged(rows=again, rejects=rejects, reasons=reasons)
    _refuse_repeated_keys(conn, request, task_ids)
    sliced = apply_statement(conn, request.results, request.result_columns, ONE_SLICE)
    found: list[str] = []
    rows = sum(_bisect(conn, request, task_id, sliced, found, batch_ref) for task_id in task_ids)
    reasons = tuple(dict.fromkeys((*reasons, *found)))[:REASONS_SHOWN]
    return Merged(rows=rows, rejects=rejects + len(found), reasons=reasons)


def _attempt(
    conn: Connection, statement: sa.TextClause, params: Mapping[str, Any]
) -> int | Exception:
    """The merge under a savepoint: rows merged, or the error of a row refused."""
    try:
        with conn.begin_nested():
            return int(conn.execute(statement, params).scalar_one())
    except sa.exc.DBAPIError as exc:
        if refusals.sqlstate(exc)[:2] not in ROW_ERROR_CLASSES:
            raise
        return exc


def _reject_nulls(
    conn: Connection, request: CommitRequest, task_ids: list[int]
) -> tuple[int, tuple[str, ...]]:
    assert request.results is not None
    shape = table_shape(conn, request.results)
    rejects, reasons = 0, []
    for column in sorted(shape.not_null & set(request.result_columns)):
        reason = refusals.null_reason(request.results.table, column)
        params = {
            **refusals.reject_fields(request),
            "task_ids": task_ids,
            "column": column,
            "reason": reason,
        }
        moved = int(conn.execute(_Q["reject_null_results"], params).rowcount)
        if moved:
            rejects += moved
            reasons.append(reason)
    return rejects, tuple(reasons)


def _refuse_if_failing(request: CommitRequest, reasons: tuple[str, ...] | list[str]) -> None:
    if request.on_invalid == "fail" and reasons:
        raise InvalidRows(
            f"batch {request.batch_id!r}: result rows the table refuses (on_invalid='fail'), "
            "first reasons: " + " | ".join(list(reasons)[:REASONS_SHOWN])
        )


def _refuse_repeated_keys(conn: Connection, request: CommitRequest, task_ids: list[int]) -> None:
    assert request.results is not None
    keys = list(request.results.conflict_keys)
    params = {"run_id": request.run_id, "task_ids": task_ids, "keys": keys}
    repeated = conn.execute(_Q["repeated_conflict_key"], params).scalar()
    if repeated is not None:
        raise BatchNotCommitted(
            f"batch {request.batch_id!r}: result rows repeat the conflict key "
            f"({', '.join(keys)}) = {repeated[:200]}; one row per key can be merged: make "
            "them unique in the job (group by the key and aggregate, or drop the duplicates)"
        )


def _bisect(
    conn: Connection,
    request: CommitRequest,
    task_id: int,
    sliced: sa.TextClause,
    found: list[str],
    batch_ref: int,
) -> int:
    """One task's rows merged in ctid slices, halved where refused: the rows merged."""
    params = {"run_id": request.run_id, "task_id": task_id, "batch_ref": batch_ref}
    ctids = [r[0] for r in conn.execute(_Q["staged_slice_bounds"], params)]
    merged, todo = 0, [(0, len(ctids))]
    while todo:
        lo, hi = todo.pop()
        if lo == hi:
            continue
        outcome = _attempt(conn, sliced, {**params, "first": ctids[lo], "last": ctids[hi - 1]})
        if isinstance(outcome, int):
            merged += outcome
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            todo += [(mid, hi), (lo, mid)]
        else:
            found.append(refusals.reject_row(conn, request, task_id, ctids[lo], outcome))
            _refuse_if_failing(request, found)
    return merged
