"""Counts for reports: what the outbox holds, read back from the database.

The demo's final report (and anything else that must show numbers) reads them
here rather than assuming them: effects by endpoint and state, attempts by
outcome, batch markers, rejects, and a digest of the invoices so two runs can
be compared.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from decimal import Decimal
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "tally.sql")


@dataclasses.dataclass(frozen=True)
class InvoiceDigest:
    rows: int
    total_amount: Decimal
    digest: str


def effects_by_endpoint(conn: Connection) -> dict[str, dict[str, int]]:
    """``{endpoint: {state: n}}``."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for endpoint, state, n in conn.execute(_Q["effects_by_endpoint_state"]):
        out[endpoint][state] = int(n)
    return dict(out)


def attempts_by_endpoint(conn: Connection) -> dict[str, dict[str, int]]:
    """``{endpoint: {outcome: n}}``."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for endpoint, outcome, n in conn.execute(_Q["attempts_by_endpoint_outcome"]):
        out[endpoint][outcome] = int(n)
    return dict(out)


def retried_effects(conn: Connection) -> dict[str, int]:
    """``{endpoint: effects that needed at least one retry}``."""
    return {e: int(n) for e, n in conn.execute(_Q["retried_effects"])}


def batches_by_job(conn: Connection) -> list[dict[str, Any]]:
    return [
        {k: (int(v) if k != "job" else v) for k, v in row.items()}
        for row in conn.execute(_Q["batches_by_job"]).mappings()
    ]


def reject_count(conn: Connection) -> int:
    return int(conn.execute(_Q["reject_count"]).scalar_one())


def reject_reasons(conn: Connection, limit: int = 3) -> list[tuple[str, int]]:
    return [(r, int(n)) for r, n in conn.execute(_Q["reject_reasons"], {"limit": limit})]


def unfinished_count(conn: Connection) -> int:
    return int(conn.execute(_Q["unfinished_count"]).scalar_one())


def delivered_count(conn: Connection) -> int:
    return int(conn.execute(_Q["delivered_count"]).scalar_one())


def dead_letters(conn: Connection, limit: int = 5) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(_Q["dead_letters"], {"limit": limit}).mappings()]


def delivered_keys(conn: Connection, endpoint: str) -> set[str]:
    return {k for (k,) in conn.execute(_Q["delivered_keys"], {"endpoint": endpoint})}


def effect_keys(conn: Connection, endpoint: str) -> set[str]:
    return {k for (k,) in conn.execute(_Q["effect_keys"], {"endpoint": endpoint})}


def invoice_digest(conn: Connection) -> InvoiceDigest:
    row = conn.execute(_Q["invoice_fingerprint"]).one()
    return InvoiceDigest(rows=int(row.n), total_amount=Decimal(row.total_amount), digest=row.digest)


def open_transactions(conn: Connection) -> tuple[int, float]:
    """(sessions with an open transaction, age in seconds of the oldest)."""
    row = conn.execute(_Q["open_transactions"]).one()
    return int(row.n), float(row.oldest_s)


def committed_batches(conn: Connection, job: str) -> dict[str, int]:
    row = conn.execute(_Q["committed_batches"], {"job": job}).mappings().one()
    return {k: int(v) for k, v in row.items()}


def invoice_dates(conn: Connection, job: str) -> list[str]:
    return [d.isoformat() for (d,) in conn.execute(_Q["invoice_dates"], {"job": job})]


def batch_states(conn: Connection, job: str, batch_id: str) -> dict[str, int]:
    """``{state: n}`` of one batch's effects."""
    rows = conn.execute(_Q["batch_states"], {"job": job, "batch_id": batch_id})
    return {str(state): int(n) for state, n in rows}
