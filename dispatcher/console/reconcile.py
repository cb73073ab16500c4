"""Reconciliation: per batch, the job's rows <-> effects <-> deliveries, and its result
rows <-> what the results table holds now; every difference explained by a
category, or reported as unexplained.

The batch marker says what the job emitted (result rows; effect rows, split into
rejected, deduplicated and new); the effect rows of the batch say what became of
the new ones (delivered, pending, dead, cancelled, expired, purged: the marker
counts the ones retention deleted). Rows its run did not write (``foreign``,
named) never make up for rows that are gone (``missing``). The result rows are
compared by content, row by row (spark_outbox.console.results). What does not
add up is unexplained, and ``outbox reconcile`` exits non-zero on it.

Categories are a table, not if-chains: a new effect state (``held``, ``uncertain``)
is one row in ``STATE_CATEGORY`` and one in ``CATEGORIES``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console import audit, results
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
            "expired",
            True,
            "its send-by time (expires_at) passed before it was sent: never sent (see last_error)",
        ),
        Category(
            "purged",
            True,
            "finished, then deleted by retention (its key stays in the key ledger)",
        ),
        Category(
            "missing",
            False,
            "counted new at commit, but no effect row its run wrote exists (counted: the "
            "batch's keys are not kept one by one)",
        ),
        Category("unexpected", False, "an effect row of the batch the marker did not count"),
        Category(
            "foreign",
            False,
            "an effect row carrying the batch's job and batch id that its run did not write "
            "(named in foreign_keys)",
        ),
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
    "expired": "expired",
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
    foreign_keys: list[str]  # the first effect rows the batch's run did not write
    results: results.ResultsCheck  # its result rows against the table now

    @property
    def unexplained(self) -> int:
        effects = sum(line.count for line in self.lines if not line.explained)
        return effects + self.results.unexplained


def _line(name: str, count: int) -> Line:
    c = CATEGORIES[name]
    return Line(category=name, count=count, explained=c.explained, meaning=c.meaning)


def batch(conn: Connection, job: str, batch_id: str) -> BatchReconciliation:
    """One committed batch (``NotFound`` if it has no marker)."""
    detail = audit.batch_detail(conn, job, batch_id)
    marker = detail.marker
    row = conn.execute(_Q["batch_marker"], {"job": job, "batch_id": batch_id}).mappings().one()
    counts = dict.fromkeys(CATEGORIES, 0)
    own = attempts = 0
    params = {"job": job, "batch_id": batch_id, "run_id": str(row["run_id"])}
    for found in conn.execute(_Q["batch_effects_by_category"], params).mappings():
        n = int(found["n"])
        if not found["own"]:
            counts["foreign"] += n
            continue
        counts[STATE_CATEGORY.get(found["state"], "unclassified")] += n
        counts["delivered_unrecorded"] += int(found["unrecorded"])
        own += n
        attempts += int(found["attempts"])
    counts["delivered"] -= counts["delivered_unrecorded"]
    counts["rejected"] = min(marker.rejects, detail.live["rejects"])
    counts["rejects_missing"] = marker.rejects - counts["rejected"]
    counts["deduplicated"] = marker.effects_deduplicated
    # Rows retention deleted are counted on the marker (stubs of older purges are rows).
    counts["purged"] += marker.effects_purged
    own += marker.effects_purged
    counts["missing"] = max(0, marker.effects_new - own)
    counts["unexpected"] = max(0, own - marker.effects_new)
    foreign = [] if not counts["foreign"] else _foreign_keys(conn, params)
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
        foreign_keys=foreign,
        results=results.check(conn, dict(row)),
    )


def _foreign_keys(conn: Connection, params: dict[str, Any]) -> list[str]:
    return [r[0] for r in conn.execute(_Q["foreign_effects"], params | {"limit": results.NAMED})]


def job(conn: Connection, job_name: str, *, limit: int = 100) -> list[BatchReconciliation]:
    """The job's newest ``limit`` batches, newest first."""
    markers = audit.batches_of_job(conn, job_name, limit=limit)
    return [batch(conn, m.job, m.batch_id) for m in markers]


def as_dict(r: BatchReconciliation) -> dict[str, Any]:
    found = dataclasses.asdict(r)
    found["results"] |= {"unexplained": r.results.unexplained}
    return found | {"unexplained": r.unexplained}
