"""Realistic rows for API tests, written the way the dispatcher and the sink write them.

``enqueue()`` for effects outside Spark; a batch marker plus effect rows for a
Spark batch; ``delivery_attempts`` rows with the outcomes of docs/design.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.schema import (
    batches,
    delivery_attempts,
    effects,
    key_ledger,
    worker_heartbeats,
)


@dataclasses.dataclass
class Built:
    key: str
    id: int


def add_effect(
    conn: Connection,
    name: str,
    *,
    endpoint: str = "billing-webhook",
    recipient: str | None = "alice@example.com",
    payload: dict[str, Any] | None = None,
) -> Built:
    """An effect enqueued by a non-Spark producer (pending, due now)."""
    key = effect_key("test", name)
    enqueue(
        conn,
        idempotency_key=key,
        endpoint=endpoint,
        payload=payload or {"name": name},
        recipient=recipient,
    )
    row_id = conn.execute(sa.select(effects.c.id).where(effects.c.idempotency_key == key))
    return Built(key=key, id=row_id.scalar_one())


def add_batch(
    conn: Connection, job: str, batch_id: str, rows: list[dict[str, Any]], **counts: int
) -> list[Built]:
    """A committed Spark batch: its marker and its effect rows, in one transaction."""
    marker = {"effects_total": len(rows), "effects_new": len(rows), "result_rows": len(rows)}
    conn.execute(
        sa.insert(batches).values(
            job=job, batch_id=batch_id, run_id=uuid.uuid4(), **(marker | counts)
        )
    )
    built = []
    for row in rows:
        key = effect_key(job, batch_id, row["name"])
        payload = row.get("payload", {"invoice": row["name"]})
        data = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        values = {
            "idempotency_key": key,
            "job": job,
            "batch_id": batch_id,
            "endpoint": row.get("endpoint", "billing-webhook"),
            "recipient": row.get("recipient"),
            "reference": row.get("reference"),
            "payload": payload,
            "payload_sha256": hashlib.sha256(data.encode()).hexdigest(),
        }
        new_id = conn.execute(sa.insert(effects).values(**values).returning(effects.c.id))
        built.append(Built(key=key, id=new_id.scalar_one()))
    return built


def add_attempt(
    conn: Connection,
    effect: Built,
    outcome: str,
    *,
    status_code: int | None = None,
    error: str | None = None,
    excerpt: str | None = None,
    minutes_ago: float = 0,
) -> None:
    """One delivery attempt, and the effect row updated the way the dispatcher would."""
    attempt = conn.execute(
        sa.update(effects)
        .where(effects.c.id == effect.id)
        .values(attempt_count=effects.c.attempt_count + 1)
        .returning(effects.c.attempt_count)
    ).scalar_one()
    started = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago)
    conn.execute(
        sa.insert(delivery_attempts).values(
            effect_id=effect.id,
            attempt=attempt,
            worker_id="worker-1",
            started_at=started,
            duration_ms=12.5,
            outcome=outcome,
            status_code=status_code,
            error_class=None if error is None else "HTTPStatus",
            error=error,
            response_excerpt=excerpt,
        )
    )
    state = {"delivered": "delivered", "dead": "dead", "gone": "dead"}.get(outcome, "pending")
    values: dict[str, Any] = {"state": state, "last_error": error}
    if state == "delivered":
        values["delivered_at"] = started
        row = conn.execute(sa.select(effects).where(effects.c.id == effect.id)).mappings().one()
        conn.execute(
            sa.insert(key_ledger).values(
                idempotency_key=row["idempotency_key"],
                endpoint=row["endpoint"],
                payload_sha256=row["payload_sha256"],
                delivered_at=started,
            )
        )
    conn.execute(sa.update(effects).where(effects.c.id == effect.id).values(**values))


def add_worker(conn: Connection, worker_id: str, *, seconds_ago: float = 1) -> None:
    seen = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)
    conn.execute(
        sa.insert(worker_heartbeats).values(
            worker_id=worker_id, hostname="host-a", pid=4242, last_seen_at=seen, in_flight=3
        )
    )


PAN = "4111111111111111"


def leaky(engine: Engine) -> Built:
    """An effect whose receiver's answers repeat its sensitive ``card.pan``: as JSON, in
    prose, and clipped mid-value (excerpts are cut at 2 KiB)."""
    body = {"error": "declined", "card": {"pan": PAN, "brand": "visa"}}
    with engine.begin() as conn:
        effect = add_effect(
            conn, "leaky", recipient="dora@example.com", payload={"invoice": "inv-9", **body}
        )
        add_attempt(
            conn,
            effect,
            "retry",
            status_code=422,
            error=f"HTTP 422: card {PAN} declined",
            excerpt="HTTP 422 Unprocessable Entity\nContent-Type: application/json\n\n"
            + json.dumps(body),
        )
        add_attempt(
            conn,
            effect,
            "retry",
            status_code=500,
            error=f"HTTP 500: upstream said pan={PAN}",
            excerpt='HTTP 500 Internal Server Error\n\n{"card": {"pan": "' + PAN[:9],
        )
    return effect


def story(engine: Engine) -> dict[str, Built]:
    """A small, realistic history: delivered after a retry, dead, pending, and a batch."""
    with engine.begin() as conn:
        delivered = add_effect(conn, "inv-1", payload={"invoice": "inv-1", "card": {"pan": "4111"}})
        add_attempt(conn, delivered, "retry", status_code=503, error="HTTP 503", excerpt="busy")
        add_attempt(conn, delivered, "delivered", status_code=200, excerpt='{"ok": true}')
        dead = add_effect(conn, "inv-2", recipient="bob@example.com")
        add_attempt(conn, dead, "dead", status_code=400, error="HTTP 400", excerpt="bad field")
        pending = add_effect(conn, "inv-3", recipient="bob@example.com")
        batch = add_batch(
            conn,
            "billing",
            "2026-11-21",
            [
                {"name": "c-1", "recipient": "carol@example.com"},
                {"name": "c-2", "recipient": "carol@example.com", "endpoint": "billing-email"},
            ],
            rejects=1,
        )
        add_worker(conn, "worker-1")
        add_worker(conn, "worker-old", seconds_ago=300)
    return {
        "delivered": delivered,
        "dead": dead,
        "pending": pending,
        "batch0": batch[0],
        "batch1": batch[1],
    }
