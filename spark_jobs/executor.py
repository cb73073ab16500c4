"""Code that runs on Spark executors: nothing heavier than psycopg2 and the key helpers.

An import-linter contract keeps it so (pyproject.toml): an executor must be able
to run with PySpark, psycopg2 and this package, without the dispatcher's
HTTP/SMTP stack, SQLAlchemy or the API.

Staging: each partition checks its effect rows against the column contract,
canonicalises payloads exactly as ``enqueue`` does (same bytes, same
``payload_sha256``), and COPYs them as CSV into the UNLOGGED staging tables in
ONE transaction per task attempt, tagged with (attempt_id, task_id). The commit
reads only the task attempts the driver saw succeed, so rows of a retried or
zombie task are never merged. The same functions run on the driver for the
small-batch path, inside the commit transaction.
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
from dispatcher.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_RECIPIENT_CHARS,
    check_endpoint_name,
    check_key,
    check_optional_text,
    payload_bytes,
    payload_sha256,
)

EFFECT_FIELDS = ("idempotency_key", "endpoint", "recipient", "payload", "ordering_key")
STAGED_EFFECT_COLUMNS = (
    "attempt_id, task_id, idempotency_key, endpoint, recipient, payload, payload_sha256, "
    "ordering_key, not_before, reject_reason, raw_row"
)
# What each staging task reports to the driver.
STAGED_SCHEMA = "task_id long, rows long"
# Test hook: pause this executor after its first COPY (kill tests "during staging").
PAUSE_ENV = "OUTBOX_SPARK_PAUSE_AT"


def effect_reject_reason(row: Mapping[str, Any]) -> str | None:
    """Why an effect row breaks the column contract, or None when it is good.

    The same checks as ``dispatcher.enqueue``; the reason names the field and
    the fix. Whether the endpoint exists is checked at commit, in SQL.
    """
    return _check(row)[0]


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


def staged_effect_rows(
    batches: Iterable[Any], attempt_id: str, task_id: int
) -> Iterator[tuple[Any, ...]]:
    """One staging tuple per effect row of the given Arrow record batches."""
    for batch in batches:
        names = batch.schema.names
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        for values in zip(*columns, strict=True):
            row = dict(zip(names, values, strict=True))
            reason, data = _check(row)
            if reason is not None:
                yield (attempt_id, task_id, *([None] * 7), reason, _raw_json(row))
                continue
            assert data is not None
            yield (
                attempt_id,
                task_id,
                row["idempotency_key"],
                row["endpoint"],
                row.get("recipient"),
                data.decode("utf-8"),
                payload_sha256(data),
                row.get("ordering_key"),
                row.get("not_before"),
                None,
                None,
            )


def copy_rows(cursor: Any, table: str, columns: str, rows: Iterable[tuple[Any, ...]]) -> int:
    """COPY tuples as CSV, in chunks of ~8 MiB; return how many rows went in."""
    import csv

    count = 0
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def flush() -> None:
        buffer.seek(0)
        cursor.copy_expert(f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv)", buffer)
        buffer.seek(0)
        buffer.truncate()

    for row in rows:
        writer.writerow(_csv_value(v) for v in row)
        count += 1
        if buffer.tell() > 8 << 20:
            flush()
    if buffer.tell():
        flush()
    _maybe_pause("staging_copy")  # rows sent, staging transaction not yet committed
    return count


_NULL = ""  # csv: an unquoted empty field is NULL


def _csv_value(value: Any) -> Any:
    if value is None:
        return _NULL
    if value == "":
        return _QuotedEmpty()
    if hasattr(value, "isoformat"):
        text = value.isoformat()
        return text if getattr(value, "tzinfo", None) is not None else text + "+00:00"
    return value


class _QuotedEmpty(str):
    """csv.writer writes ``""`` for this, so PostgreSQL reads an empty string, not NULL."""

    def __new__(cls) -> _QuotedEmpty:
        return super().__new__(cls, "")


def stage_partition(
    dsn: str, attempt_id: str, kind: str
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
            with conn, conn.cursor() as cur:
                count = stage(cur, kind, batches, attempt_id, task_id)
        finally:
            conn.close()
        yield pa.RecordBatch.from_pydict(
            {"task_id": [task_id], "rows": [count]},
            schema=pa.schema([("task_id", pa.int64()), ("rows", pa.int64())]),
        )

    return run


def stage(cursor: Any, kind: str, batches: Iterable[Any], attempt_id: str, task_id: int) -> int:
    """Stage record batches of ``kind`` ("effects" or "results") through ``cursor``."""
    if kind == "effects":
        rows = staged_effect_rows(batches, attempt_id, task_id)
        return copy_rows(cursor, "staged_effects", STAGED_EFFECT_COLUMNS, rows)
    result_rows = (
        (attempt_id, task_id, text) for batch in batches for text in batch.column(0).to_pylist()
    )
    return copy_rows(cursor, "staged_results", "attempt_id, task_id, row", result_rows)


def _maybe_pause(phase: str) -> None:
    """Test hook: print a marker and pause so a kill test can SIGKILL the driver here."""
    if os.environ.get(PAUSE_ENV) == phase:
        print(f"outbox-phase: {phase} (executor pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("OUTBOX_SPARK_PAUSE_S", "30")))
