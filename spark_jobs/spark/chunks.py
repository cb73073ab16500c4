"""How an executor writes its partition of effects into the outbox, chunk by chunk.

Runs on Spark executors (psycopg2 and pyarrow only). Each chunk is one
transaction: checked rows (spark_outbox.spark.checks), keys of the key ledger removed,
sorted by key, tagged with the run, and COPYed straight into ``effects``,
invisible until the run's marker commits. A chunk that meets a taken key
(unique violation) is rolled back to its savepoint and written through the
temporary table ``incoming_effects`` with ``ON CONFLICT DO NOTHING``; every
taken key is then classified (executor.sql, ``classify_taken``): visible ->
deduplicated, this run's own -> fine, another markerless run's -> deferred.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Any

from spark_outbox.core import sqltext
from spark_outbox.spark import pgbinary, phases
from spark_outbox.spark.checks import VALID_COLUMNS, checked_effects
from spark_outbox.spark.pgbinary import CopyData
from spark_outbox.spark.protocol import RunTag, TaskReport, first_keys

_Q = sqltext.beside(__file__, "executor.sql")
# Two runs inserting overlapping keys in different orders can deadlock; PostgreSQL
# aborts one chunk, which is simply tried again (it is one transaction).
_DEADLOCK_TRIES = 5
# The checked text and JSON columns COPY writes into effects, in its order; then
# expires_at, and not_before (as next_attempt_at) for rows that have one.
_EFFECT_COLUMNS = tuple(name for name in VALID_COLUMNS if name not in ("not_before", "expires_at"))
# psycopg2 sends a COPY in pieces of this size (its default, 8 KiB, means ~3,000 calls a chunk).
_READ_BYTES = 1 << 20


def write_effects(
    conn: Any, run: RunTag, task_id: int, batches: Iterable[Any], chunk_rows: int
) -> TaskReport:
    """Check and write ``batches`` in chunks of about ``chunk_rows`` rows."""
    with conn.cursor() as cur:
        cur.execute(_Q["create_incoming"])
    conn.commit()
    chunk = _Chunk(conn, run, task_id)
    conn.commit()
    report = TaskReport(task_id)
    for n, (valid, rejects) in enumerate(_checked_chunks(batches, run, chunk_rows), 1):
        report += chunk.write(valid, rejects)
        if n == 1:
            phases.reached("effects_written")  # a kill test's "mid-write"
    return report


def _checked_chunks(
    batches: Iterable[Any], run: RunTag, chunk_rows: int
) -> Iterator[tuple[Any, Any]]:
    """(valid, rejects) tables of about ``chunk_rows`` checked rows each."""
    import pyarrow as pa

    valid: list[Any] = []
    rejects: list[Any] = []
    for batch in batches:
        good, bad = checked_effects(batch, run.endpoints)
        valid.append(good)
        rejects.append(bad)
        if sum(t.num_rows for t in valid) + sum(t.num_rows for t in rejects) >= chunk_rows:
            yield pa.concat_tables(valid), pa.concat_tables(rejects)
            valid, rejects = [], []
    if valid:
        yield pa.concat_tables(valid), pa.concat_tables(rejects)


class _Chunk:
    """Writes one chunk per transaction: straight into the outbox by COPY while no
    key of this task was taken, else through ``incoming_effects`` and classified."""

    def __init__(self, conn: Any, run: RunTag, task_id: int) -> None:
        self.conn = conn
        self.run = run
        self.task_id = task_id
        self.params = {
            "job": run.job,
            "batch_id": run.batch_id,
            "run_id": run.run_id,
            "task_id": task_id,
        }
        self.optimistic = True  # plain COPY until a key turns out to be taken
        with conn.cursor() as cur:
            cur.execute(_Q["ledger_is_empty"])
            self.ledger_empty = bool(cur.fetchone()[0])

    def write(self, valid: Any, rejects: Any) -> TaskReport:
        """One chunk, one transaction; what it wrote."""
        import psycopg2.errors

        rows = valid.num_rows
        valid, ledger_mismatches = self._without_ledger_keys(valid)
        plain, scheduled = _tagged_copy(valid, self.run)
        rejects_csv = self._rejects_csv(rejects)
        for attempt in range(_DEADLOCK_TRIES):
            try:
                mismatches, deferred, keys = self._once(
                    plain, scheduled, valid.num_rows, rejects_csv
                )
                break
            except psycopg2.errors.DeadlockDetected:
                self.conn.rollback()
                if attempt == _DEADLOCK_TRIES - 1:
                    raise
        return TaskReport(
            self.task_id,
            rows=rows,
            mismatches=len(ledger_mismatches) + mismatches,
            deferred=deferred,
            rejects=rejects.num_rows,
            mismatch_keys=first_keys([*ledger_mismatches, *keys]),
        )

    def _once(
        self, plain: CopyData, scheduled: CopyData | None, rows: int, rejects_csv: bytes | None
    ) -> tuple[int, int, list[str]]:
        """One transaction; (mismatches, deferred, a few mismatched keys) among the taken keys."""
        counts: tuple[int, int, list[str]] = (0, 0, [])
        with self.conn.cursor() as cur:
            if rows and not (self.optimistic and self._copy_straight(cur, plain, scheduled)):
                counts = self._insert_classified(cur, plain, scheduled, rows)
            if rejects_csv is not None:
                cur.copy_expert(_Q["stage_rejects"], io.BytesIO(rejects_csv))
        self.conn.commit()
        return counts

    def _copy_straight(self, cur: Any, plain: CopyData, scheduled: CopyData | None) -> bool:
        import psycopg2.errors

        cur.execute("SAVEPOINT straight")
        try:
            cur.copy_expert(_Q["copy_effects"], plain.open(), _READ_BYTES)
            if scheduled is not None:
                cur.copy_expert(_Q["copy_scheduled_effects"], scheduled.open(), _READ_BYTES)
            return True
        except psycopg2.errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT straight")
            self.optimistic = False
            return False

    def _insert_classified(
        self, cur: Any, plain: CopyData, scheduled: CopyData | None, rows: int
    ) -> tuple[int, int, list[str]]:
        cur.copy_expert(_Q["copy_incoming"], plain.open(), _READ_BYTES)
        if scheduled is not None:
            cur.copy_expert(_Q["copy_scheduled_incoming"], scheduled.open(), _READ_BYTES)
        cur.execute(_Q["insert_effects"])
        if cur.rowcount == rows:
            return 0, 0, []
        cur.execute(_Q["classify_taken"], self.params)
        mismatches, deferred, keys = cur.fetchone()
        return int(mismatches), int(deferred), list(keys or ())

    def _without_ledger_keys(self, valid: Any) -> tuple[Any, list[str]]:
        """Keys in the key ledger leave the chunk: deduplicated; the ones stored
        with another payload are returned (mismatches)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.ledger_empty or not valid.num_rows:
            return valid, []
        with self.conn.cursor() as cur:
            cur.execute(_Q["ledger_keys"], {"keys": valid.column("idempotency_key").to_pylist()})
            known = dict(cur.fetchall())
        if not known:
            return valid, []
        keys = valid.column("idempotency_key")
        taken = pc.is_in(keys, value_set=pa.array(list(known), pa.string()))
        mismatched = [
            key
            for key, sha in zip(
                pc.filter(keys, taken).to_pylist(),
                pc.filter(valid.column("payload_sha256"), taken).to_pylist(),
                strict=True,
            )
            if known[key] != sha
        ]
        return valid.filter(pc.invert(taken)), mismatched

    def _rejects_csv(self, rejects: Any) -> bytes | None:
        import pyarrow as pa

        n = rejects.num_rows
        if not n:
            return None
        tagged = pa.table(
            {
                "run_id": pa.repeat(pa.scalar(self.run.run_id), n),
                "task_id": pa.repeat(pa.scalar(self.task_id, pa.int64()), n),
                "reason": rejects.column("reason"),
                "raw_row": rejects.column("raw_row"),
            }
        )
        return csv(tagged).getvalue()


def _tagged_copy(valid: Any, run: RunTag) -> tuple[CopyData, CopyData | None]:
    """The chunk as binary COPY streams (spark_outbox.spark.pgbinary), tagged with the run:
    rows due now (the column default now() sets next_attempt_at), and rows with
    not_before (it does). Sorted by key: neighbouring keys land on neighbouring
    pages of the unique index."""
    import pyarrow.compute as pc

    valid = valid.take(pc.sort_indices(valid, [("idempotency_key", "ascending")]))
    due_now = pc.is_null(valid.column("not_before"))
    plain = valid.filter(due_now)
    scheduled = valid.filter(pc.invert(due_now))
    return (
        _copy_stream(plain, run, scheduled=False),
        _copy_stream(scheduled, run, scheduled=True) if scheduled.num_rows else None,
    )


def _copy_stream(rows: Any, run: RunTag, *, scheduled: bool) -> CopyData:
    """Fields in the order of executor.sql's COPY column lists."""
    shared = (
        pgbinary.field_count(len(_EFFECT_COLUMNS) + 4 + int(scheduled))
        + pgbinary.text(run.job)
        + pgbinary.text(run.batch_id)
        + pgbinary.uuid_field(run.run_id)
    )
    columns = [
        pgbinary.jsonb_column(rows.column(name))
        if name == "payload"
        else pgbinary.text_column(rows.column(name))
        for name in _EFFECT_COLUMNS
    ]
    columns.append(pgbinary.timestamptz_column(rows.column("expires_at")))
    if scheduled:
        columns.append(pgbinary.timestamptz_column(rows.column("not_before")))
    return pgbinary.copy_stream(rows.num_rows, shared, columns)


def csv(table: Any) -> io.BytesIO:
    """Arrow quotes every string and leaves nulls unquoted and empty: in
    PostgreSQL's CSV that is '' for an empty string and NULL for null."""
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    return buffer
