"""Batches the volume guard held (spark_outbox.spark.guard): listed, released, cancelled.

A held batch is committed: its results and rejects are in, its effects are
visible to the audit, but ``claimable_effects`` excludes them until an operator
decides. Release lets them flow; cancel marks its pending effects cancelled, so
nothing of it is delivered and its keys stay known (a re-run deduplicates
them). Both take a reason, count first on a dry run, and write their
``operator_actions`` row in the same transaction as the change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy.engine import Connection

from spark_outbox.console.audit import from_row
from spark_outbox.core import wakeup
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import Conflict, NotFound
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "holds.sql")


@dataclasses.dataclass(frozen=True)
class HeldBatch:
    job: str
    batch_id: str
    committed_at: dt.datetime
    effects_new: int
    hold_reason: str | None
    pending: int  # effects still waiting for the decision


@dataclasses.dataclass(frozen=True)
class HoldDecision:
    job: str
    batch_id: str
    action: str  # release | cancel
    effects: int  # pending effects released or cancelled (counted only on a dry run)
    dry_run: bool


@dataclasses.dataclass(frozen=True)
class HeldCounts:
    batches: int
    effects: int


def held_batches(conn: Connection, *, limit: int = 100) -> list[HeldBatch]:
    rows = conn.execute(_Q["held_batches"], {"limit": limit}).mappings()
    return [from_row(HeldBatch, r) for r in rows]


def held_counts(conn: Connection) -> HeldCounts:
    row = conn.execute(_Q["held_effect_counts"]).one()
    return HeldCounts(batches=int(row[0]), effects=int(row[1]))


def release(
    conn: Connection, job: str, batch_id: str, *, actor: str, reason: str, dry_run: bool
) -> HoldDecision:
    """The held batch's effects become claimable; the dispatchers are woken."""
    return _decide(conn, job, batch_id, "release", actor=actor, reason=reason, dry_run=dry_run)


def cancel(
    conn: Connection, job: str, batch_id: str, *, actor: str, reason: str, dry_run: bool
) -> HoldDecision:
    """The held batch's pending effects are cancelled: none is ever sent."""
    return _decide(conn, job, batch_id, "cancel", actor=actor, reason=reason, dry_run=dry_run)


def _decide(
    conn: Connection,
    job: str,
    batch_id: str,
    action: str,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
) -> HoldDecision:
    reason = check_reason(reason)
    params = {"job": job, "batch_id": batch_id}
    marker = conn.execute(_Q["lock_batch"], params).first()
    if marker is None:
        raise NotFound(f"no committed batch {batch_id!r} of job {job!r}")
    if marker.hold_state != "held":
        state = marker.hold_state or "not held"
        done = "released" if action == "release" else "cancelled"
        raise Conflict(
            f"batch {batch_id!r} of job {job!r} is {state}; only a held batch can be {done}"
        )
    params["run_id"] = marker.run_id
    count = int(conn.execute(_Q["count_held_effects"], params).scalar_one())
    if not dry_run:
        verb = "cancel_held_effects" if action == "cancel" else "release_held_effects"
        count = int(conn.execute(_Q[verb], params).rowcount)
        state = "released" if action == "release" else "cancelled"
        conn.execute(_Q["resolve_hold"], params | {"hold_state": state})
        record_action(
            conn,
            actor=actor,
            action=f"{action}_batch",
            target=f"{job}/{batch_id}",
            reason=reason,
            details={"effects": count},
        )
        if action == "release":
            wakeup.notify(conn, f"released {job}/{batch_id}")
    return HoldDecision(job=job, batch_id=batch_id, action=action, effects=count, dry_run=dry_run)
