"""Code that runs on Spark executors: nothing heavier than psycopg2 and the key helpers.

An import-linter contract keeps it so (pyproject.toml): an executor must be able
to run with PySpark, psycopg2 and this package, without the dispatcher's
HTTP/SMTP stack, SQLAlchemy or the API.

Staging: each partition checks its effect rows against the column contract
(vectorised in Arrow; only payloads are handled row by row), canonicalises
payloads exactly as ``enqueue`` does (same bytes, same ``payload_sha256``), and
COPYs them as CSV written by Arrow into the UNLOGGED staging tables, tagged
(run_id, task_id, chunk). Every ``CHUNK_ROWS`` rows a chunk commits together
with its ``staged_chunks`` row, so the driver's commit transaction can merge it
while later chunks are staged. What ends in the batch is only what the Spark
tasks the driver saw succeed staged: a merged chunk of any other task (a retried
or zombie task; each try of a task has its own id) makes the commit start over
with those tasks only. The same functions run on the driver for the small-batch
path, inside the commit transaction, as one uncommitted chunk.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from dispatcher.errors import InvalidEffect
from dispatcher.pgterse import make_terse
from dispatcher.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_RECIPIENT_CHARS,
    check_endpoint_name,
    check_key,
    check_optional_text,
    payload_bytes,
    payload_sha256,
)

_TAGS = "run_id, task_id, chunk"
STAGED_COLUMNS = {
    "effects": f"{_TAGS}, idempotency_key, endpoint, recipient, payload, payload_sha256, "
    "ordering_key, not_before, reject_reason, raw_row",
    "results": f"{_TAGS}, row",
}
# Rows per staging chunk: each chunk commits on its own, and the driver's commit
# transaction merges it while the executors stage the next ones.
CHUNK_ROWS = 50_000
# What each staging task reports to the driver.
STAGED_SCHEMA = "task_id long, rows long"
# Test hook: pause this executor after its first COPY (kill tests "during staging").
PAUSE_ENV = "OUTBOX_SPARK_PAUSE_AT"


def _check(row: Mapping[str, Any]) -> tuple[str | None, bytes | None]:
    """(reason, canonical payload bytes): exactly one of them is None."""
    declared = row.get("reject_reason")
    if declared:
        return str(declared), None
    try:
        check_key(row.get("idempotency_key"))
        check_endpoint_name(row.get("endpoint"))
        data = payload_bytes(row.get("payload"))
        check_optional_text("recipient", row.get("recipient"), MAX_RECIPIENT_CHARS)
        check_optional_text("ordering_key", row.get("ordering_key"), MAX_ORDERING_KEY_CHARS)
        for field in ("endpoint", "recipient", "ordering_key"):
            if "\x00" in (row.get(field) or ""):
                raise InvalidEffect(field, "contains a NUL character", "remove it")
    except InvalidEffect as exc:
        return str(exc), None
    except ValueError as exc:  # e.g. a lone surrogate escape that UTF-8 cannot encode
        return f"payload: cannot be encoded as UTF-8 JSON ({exc}); fix the text", None
    return None, data


def _raw_json(row: Mapping[str, Any]) -> str:
    """The rejected row as JSON text that jsonb accepts (NUL characters replaced)."""
    clean = {k: _printable(v) for k, v in row.items() if k != "reject_reason"}
    return json.dumps(clean, ensure_ascii=False, default=str)


def _printable(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


# What a row must look like to skip the per-row checks: every row the vectorised
# test does not clear goes through ``_check``, so its reason is exactly the one
# ``enqueue`` would give.
_KEY_REGEX = r"^[0-9a-f]{64}$"
_VISIBLE = r"[!-~]"  # at least one printable ASCII character: str.strip() keeps it
_COPY_CHUNK_BYTES = 8 << 20


def staged_effects(batch: Any) -> Any:
    """The staging rows (an Arrow table, untagged) for one Arrow record batch of effects.

    Vectorised checks clear the plain rows; only payloads are handled one by one
    (canonical JSON and its hash, as ``enqueue`` computes them). Rows the
    vectorised test does not clear, and rows whose payload fails, get the exact
    per-row check and, if bad, a reject reason and their raw JSON.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    column = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    plain = pc.and_kleene(
        pc.is_null(column["reject_reason"]),
        pc.match_substring_regex(column["idempotency_key"], _KEY_REGEX),
    )
    plain = pc.and_kleene(plain, _clean_text(column["endpoint"], None, required=True))
    plain = pc.and_kleene(plain, _clean_text(column["recipient"], MAX_RECIPIENT_CHARS))
    plain = pc.and_kleene(plain, _clean_text(column["ordering_key"], MAX_ORDERING_KEY_CHARS))
    cleared = pc.fill_null(plain, False).to_pylist()

    payloads: list[bytes | None] = [None] * n
    hashes: list[str | None] = [None] * n
    reasons: list[str | None] = [None] * n
    raw_rows: list[str | None] = [None] * n
    for i, (fast, text) in enumerate(zip(cleared, column["payload"].to_pylist(), strict=True)):
        data = None
        if fast and isinstance(text, str):
            try:
                data = payload_bytes(text)
            except (InvalidEffect, ValueError):
                data = None
        if data is None:
            row = {name: values[i].as_py() for name, values in column.items()}
            reason, data = _check(row)
            if reason is not None:
                reasons[i], raw_rows[i] = reason, _raw_json(row)
                continue
        assert data is not None
        payloads[i], hashes[i] = data, payload_sha256(data)

    valid = pa.array([r is None for r in reasons], pa.bool_())

    def kept(name: str) -> Any:
        values = column[name]
        return pc.if_else(valid, values, pa.nulls(n, values.type))

    return pa.table(
        {
            "idempotency_key": kept("idempotency_key"),
            "endpoint": kept("endpoint"),
            "recipient": kept("recipient"),
            "payload": pa.array(payloads, pa.binary()).cast(pa.string()),
            "payload_sha256": pa.array(hashes, pa.string()),
            "ordering_key": kept("ordering_key"),
            "not_before": kept("not_before"),
            "reject_reason": pa.array(reasons, pa.string()),
            "raw_row": pa.array(raw_rows, pa.string()),
        }
    )


def _clean_text(values: Any, max_chars: int | None, *, required: bool = False) -> Any:
    """True where the text is surely fine (null allowed unless required), else false/null."""
    import pyarrow.compute as pc

    ok = pc.invert(pc.match_substring(values, "\x00"))
    if max_chars is not None:
        ok = pc.and_kleene(ok, pc.less_equal(pc.utf8_length(values), max_chars))
    if required:
        return pc.and_kleene(ok, pc.match_substring_regex(values, _VISIBLE))
    return pc.or_kleene(pc.is_null(values), ok)


class _CopyStream:
    """Tagged Arrow tables written as CSV and sent by COPY in pieces of ~8 MiB.

    With ``chunk_rows``, every ``chunk_rows`` rows end a chunk: it is announced in
    ``staged_chunks`` and committed, so the driver can merge it at once. Without,
    everything is one chunk in the caller's transaction (the driver path).
    """

    def __init__(
        self, cursor: Any, kind: str, run_id: str, task_id: int, chunk_rows: int | None
    ) -> None:
        self.cursor = cursor
        self.kind = kind
        self.tags = (run_id, task_id)
        self.chunk_rows = chunk_rows
        self.statement = f"COPY staged_{kind} ({STAGED_COLUMNS[kind]}) FROM STDIN WITH (FORMAT csv)"
        self.buffer = io.BytesIO()
        self.rows = 0
        self.chunk = 0
        self.chunk_size = 0

    def write(self, table: Any) -> None:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        n = table.num_rows
        tags = [
            pa.repeat(pa.scalar(self.tags[0]), n),
            pa.repeat(pa.scalar(self.tags[1], pa.int64()), n),
            pa.repeat(pa.scalar(self.chunk, pa.int32()), n),
        ]
        tagged = pa.Table.from_arrays([*tags, *table.columns], ["a", "t", "c", *table.schema.names])
        # Arrow quotes every string and leaves nulls unquoted and empty: in
        # PostgreSQL's CSV that is '' for an empty string and NULL for null.
        pacsv.write_csv(tagged, self.buffer, pacsv.WriteOptions(include_header=False))
        self.rows += n
        self.chunk_size += n
        if self.chunk_rows is not None and self.chunk_size >= self.chunk_rows:
            self.end_chunk()
        elif self.buffer.tell() > _COPY_CHUNK_BYTES:
            self.send()

    def send(self) -> None:
        if self.buffer.tell():
            self.buffer.seek(0)
            self.cursor.copy_expert(self.statement, self.buffer)
            self.buffer.seek(0)
            self.buffer.truncate()

    def end_chunk(self, *, last: bool = False) -> None:
        self.send()
        if last:
            _maybe_pause("staging_copy")  # rows sent, the chunk not yet committed
        if self.chunk_rows is None or not self.chunk_size:
            return
        self.cursor.execute(
            "INSERT INTO staged_chunks (run_id, kind, task_id, chunk, rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (self.tags[0], self.kind, self.tags[1], self.chunk, self.chunk_size),
        )
        self.cursor.connection.commit()
        self.chunk += 1
        self.chunk_size = 0


def stage_partition(
    dsn: str, run_id: str, kind: str, chunk_rows: int = CHUNK_ROWS
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that stages one partition of effects or results."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import psycopg2
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        task_id = context.taskAttemptId() if context is not None else 0
        conn = psycopg2.connect(dsn, application_name=f"spark-outbox-stage-{kind}")
        try:
            make_terse(conn)  # a failed COPY's message would quote the row
            with conn, conn.cursor() as cur:
                count = stage(cur, kind, batches, run_id, task_id, chunk_rows)
        finally:
            conn.close()
        yield pa.RecordBatch.from_pydict(
            {"task_id": [task_id], "rows": [count]},
            schema=pa.schema([("task_id", pa.int64()), ("rows", pa.int64())]),
        )

    return run


def stage(
    cursor: Any,
    kind: str,
    batches: Iterable[Any],
    run_id: str,
    task_id: int,
    chunk_rows: int | None = None,
) -> int:
    """Stage record batches of ``kind`` ("effects" or "results") through ``cursor``.

    With ``chunk_rows`` (executors), each chunk commits on the cursor's
    connection; without (the driver path), nothing is committed here.
    """
    stream = _CopyStream(cursor, kind, run_id, task_id, chunk_rows)
    for batch in batches:
        stream.write(staged_effects(batch) if kind == "effects" else batch)
    stream.end_chunk(last=True)
    return stream.rows


def _maybe_pause(phase: str) -> None:
    """Test hook: print a marker and pause so a kill test can SIGKILL the driver here."""
    if os.environ.get(PAUSE_ENV) == phase:
        print(f"outbox-phase: {phase} (executor pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("OUTBOX_SPARK_PAUSE_S", "30")))
