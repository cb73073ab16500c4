"""Reconciliation: per batch, the job's rows <-> effects <-> deliveries, every difference
explained by a category, or counted as unexplained.

The batch marker says what the job emitted (result rows; effect rows, split into
rejected, deduplicated and new); the effect rows of the batch say what became of
the new ones (delivered, pending, dead, cancelled, purged: the marker counts the
ones retention deleted). What does not add up
is unexplained, and ``outbox reconcile`` exits non-zero on it.

Categories are a table, not if-chains: a new effect state (``held``, ``uncertain``)
is one row in ``STATE_CATEGORY`` and one in ``CATEGORIES``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console import audit
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "reconcile.sql")


@dataclasses.dataclass(frozen=True)
class Category:
    name: str
    explained: bool
    meaning: str


CATEGORIES = {
    c.name: c
    for c in (
        Category("rejected", True, "broke the effect contract; kept in rejects with the reason"),
        Category(
            "deduplicated",
            True,
            "key already known (an earlier batch or run, enqueue(), the key ledger): "
            "not enqueued again",
        ),
        Category("delivered", True, "sent; the receiver acknowledged it"),
        Category("pending", True, "waiting for its first or next attempt, or being sent"),
        Category("dead", True, "given up (see last_error): requeue or recover it once fixed"),
        Category("cancelled", True, "cancelled by an operator: never sent"),
        Category(
            "held",
            True,
            "in a batch the volume guard held: sent after an operator's release, "
            "never after a cancel",
        ),
        Category(
            "uncertain",
            True,
            "its send started and the outcome is unknown (the endpoint cannot deduplicate): "
            "an operator marks it delivered or sends it again",
        ),
        Category(
            "purged",
            True,
            "finished, then deleted by retention (its key stays in the key ledger)",
        ),
        Category("missing", False, "counted new at commit, but no effect row of the batch exists"),
        Category("unexpected", False, "an effect row of the batch the marker did not count"),
        Category("rejects_missing", False, "counted rejected at commit, not in the rejects table"),
        Category(
            "delivered_unrecorded",
            False,
            "delivered, but neither a delivered attempt nor a key-ledger row records it",
        ),
        Category("unclassified", False, "an effect state this reconciliation does not know"),
    )
}

# Effect state (purged rows apart) -> category.
STATE_CATEGORY = {
    "pending": "pending",
    "leased": "pending",
    "delivered": "delivered",
    "dead": "dead",
    "cancelled": "cancelled",
    "held": "held",
    "uncertain": "uncertain",
    "purged": "purged",
}


@dataclasses.dataclass(frozen=True)
class Line:
    category: str
    count: int
    explained: bool
    meaning: str


@dataclasses.dataclass(frozen=True)
class BatchReconciliation:
    job: str
    batch_id: str
    committed_at: dt.datetime
    result_rows: int
    effect_rows: int  # what the job emitted for the effects side: valid rows + rejects
    payload_mismatches: int  # of the deduplicated rows, those whose payload differed
    attempts: int  # delivery attempts counted on the batch's effects
    lines: list[Line]

    @property
    def unexplained(self) -> int:
        return sum(line.count for line in self.lines if not line.explained)


def _line(name: str, count: int) -> Line:
    c = CATEGORIES[name]
    return Line(category=name, count=count, explained=c.explained, meaning=c.meaning)


def batch(conn: Connection, job: str, batch_id: str) -> BatchReconciliation:
    """One committed batch (``NotFound`` if it has no marker)."""
    detail = audit.batch_detail(conn, job, batch_id)
    marker = detail.marker
    counts = dict.fromkeys(CATEGORIES, 0)
    found = attempts = 0
    params = {"job": job, "batch_id": batch_id}
    for row in conn.execute(_Q["batch_effects_by_category"], params).mappings():
        counts[STATE_CATEGORY.get(row["state"], "unclassified")] += int(row["n"])
        counts["delivered_unrecorded"] += int(row["unrecorded"])
        found += int(row["n"])
        attempts += int(row["attempts"])
    counts["delivered"] -= counts["delivered_unrecorded"]
    counts["rejected"] = min(marker.rejects, detail.live["rejects"])
    counts["rejects_missing"] = marker.rejects - counts["rejected"]
    counts["deduplicated"] = marker.effects_deduplicated
    # Rows retention deleted are counted on the marker (stubs of older purges are rows).
    counts["purged"] += marker.effects_purged
    found += marker.effects_purged
    counts["missing"] = max(0, marker.effects_new - found)
    counts["unexpected"] = max(0, found - marker.effects_new)
    lines = [_line(n, c) for n, c in counts.items() if c or CATEGORIES[n].explained]
    return BatchReconciliation(
        job=job,
        batch_id=batch_id,
        committed_at=marker.committed_at,
        result_rows=marker.result_rows,
        effect_rows=marker.effects_total + marker.rejects,
        payload_mismatches=marker.payload_mismatches,
        attempts=attempts,
        lines=lines,
    )


def job(conn: Connection, job_name: str, *, limit: int = 100) -> list[BatchReconciliation]:
    """The job's newest ``limit`` batches, newest first."""
    markers = audit.batches_of_job(conn, job_name, limit=limit)
    return [batch(conn, m.job, m.batch_id) for m in markers]


def as_dict(r: BatchReconciliation) -> dict[str, Any]:
    return dataclasses.asdict(r) | {"unexplained": r.unexplained}
