"""The preview's Spark tasks: check a partition of effects and compare it with what
is stored, writing nothing (a read-only connection: PostgreSQL refuses any write).

Runs on executors (psycopg2, pyarrow, the checks). Each task reports one JSON
summary: valid rows, new effects per endpoint, stored keys with the same
payload and with another one (by state, with a few example diffs, each value
truncated), and the rejects by reason. The driver adds them up (spark_outbox.spark.preview).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from spark_outbox.core import sqltext
from spark_outbox.spark.checks import checked_effects

_Q = sqltext.beside(__file__, "preview_tasks.sql")
REPORT_SCHEMA = "summary string"
EXAMPLES = 3
VALUE_CHARS = 40


def preview_writer(dsn: str, endpoints: Mapping[str, str]) -> Any:
    """The ``mapInArrow`` function that previews one partition (keys hashed together)."""

    def preview(batches: Iterator[Any]) -> Iterator[Any]:
        import psycopg2
        import pyarrow as pa

        conn = psycopg2.connect(
            dsn,
            application_name="spark-outbox-preview",
            options="-c default_transaction_read_only=on",
        )
        summary = _empty()
        seen: set[str] = set()
        try:
            for batch in batches:
                valid, rejects = checked_effects(batch, endpoints)
                summary["rejects"].update(rejects.column("reason").to_pylist())
                _compare(conn, valid, seen, summary)
        finally:
            conn.rollback()
            conn.close()
        yield pa.RecordBatch.from_pydict({"summary": [json.dumps(summary)]})

    return preview


def _empty() -> dict[str, Any]:
    return {
        "rows": 0,
        "new": Counter(),
        "same": Counter(),
        "different": Counter(),
        "examples": [],
        "rejects": Counter(),
    }


def _compare(conn: Any, valid: Any, seen: set[str], summary: dict[str, Any]) -> None:
    rows = valid.select(["idempotency_key", "endpoint", "payload", "payload_sha256"]).to_pylist()
    summary["rows"] += len(rows)
    with conn.cursor() as cur:
        cur.execute(_Q["stored_keys"], {"keys": [r["idempotency_key"] for r in rows]})
        stored = {key: (state, sha, payload) for key, state, sha, payload in cur.fetchall()}
    for row in rows:
        key = row["idempotency_key"]
        if key in seen:  # a twin in the batch: the write keeps one
            continue
        seen.add(key)
        if key not in stored:
            summary["new"][row["endpoint"]] += 1
            continue
        state, sha, payload = stored[key]
        if sha == row["payload_sha256"]:
            summary["same"][state] += 1
            continue
        summary["different"][state] += 1
        if len(summary["examples"]) < EXAMPLES:
            summary["examples"].append(
                {"idempotency_key": key, "state": state, "diff": diff(payload, row["payload"])}
            )


def diff(stored: str | None, new: str) -> dict[str, list[str | None]]:
    """Top-level fields whose values differ: [stored, new], each truncated."""
    before = json.loads(stored) if stored else {}
    after = json.loads(new)
    return {
        field: [_short(before.get(field)), _short(after.get(field))]
        for field in sorted(set(before) | set(after))
        if before.get(field) != after.get(field)
    }


def _short(value: Any) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"
