"""The preview's Spark tasks: check a partition of effects and compare it with what
is stored, writing nothing (a read-only connection: PostgreSQL refuses any write).

Runs on executors (psycopg2, pyarrow, the checks). Each task reports what a
write's task does (spark_jobs.protocol.TaskReport): valid rows, new effects
per endpoint, stored keys with the same payload and with another one (by state,
with a few example diffs, each value truncated), and the rejects by reason. The
driver adds them up (spark_outbox.spark.preview).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from spark_outbox.core import sqltext
from spark_outbox.spark.checks import checked_effects
from spark_outbox.spark.protocol import EXAMPLES_KEPT, TaskReport

_Q = sqltext.beside(__file__, "preview_tasks.sql")
VALUE_CHARS = 40


def preview_writer(dsn: str, endpoints: Mapping[str, str]) -> Any:
    """The ``mapInArrow`` function that previews one partition (keys hashed together)."""

    def preview(batches: Iterator[Any]) -> Iterator[Any]:
        import psycopg2

        conn = psycopg2.connect(
            dsn,
            application_name="spark-outbox-preview",
            options="-c default_transaction_read_only=on",
        )
        report = TaskReport()
        seen: set[str] = set()
        try:
            for batch in batches:
                valid, rejects = checked_effects(batch, endpoints)
                reasons = Counter(rejects.column("reason").to_pylist())
                report += TaskReport(rejects=rejects.num_rows, reject_reasons=reasons)
                report += _compared(conn, valid, seen)
        finally:
            conn.rollback()
            conn.close()
        yield report.to_batch()

    return preview


def _compared(conn: Any, valid: Any, seen: set[str]) -> TaskReport:
    """``valid`` compared with what is stored: new, same payload, another payload."""
    rows = valid.select(["idempotency_key", "endpoint", "payload", "payload_sha256"]).to_pylist()
    new: Counter[str] = Counter()
    same: Counter[str] = Counter()
    different: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    with conn.cursor() as cur:
        cur.execute(_Q["stored_keys"], {"keys": [r["idempotency_key"] for r in rows]})
        stored = {key: (state, sha, payload) for key, state, sha, payload in cur.fetchall()}
    for row in rows:
        key = row["idempotency_key"]
        if key in seen:  # a twin in the batch: the write keeps one
            continue
        seen.add(key)
        if key not in stored:
            new[row["endpoint"]] += 1
            continue
        state, sha, payload = stored[key]
        if sha == row["payload_sha256"]:
            same[state] += 1
            continue
        different[state] += 1
        if len(examples) < EXAMPLES_KEPT:
            examples.append(
                {"idempotency_key": key, "state": state, "diff": diff(payload, row["payload"])}
            )
    return TaskReport(
        rows=len(rows),
        mismatches=different.total(),
        new_by_endpoint=new,
        same_by_state=same,
        different_by_state=different,
        examples=tuple(examples),
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
