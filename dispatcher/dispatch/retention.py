"""Retention: finished effects are deleted after a while; their keys stay known.

``outbox purge --older-than 30d`` runs it once; a dispatcher with
``OUTBOX_RETENTION_OLDER_THAN`` set runs it as its ``retention`` side task every
``OUTBOX_RETENTION_INTERVAL_S``. Work goes in small batches, each its own short
transaction locking only its rows (``FOR UPDATE SKIP LOCKED``): no table lock,
no long transaction, and several dispatchers purging at once share the work.

A purged effect is deleted with its attempts (``retention.sql``): a stub kept in
its place was a new version of the row in every index, and the table grew with
every purge. What stays is its key in ``key_ledger`` with the final state,
written by the trigger on every DELETE of effects in the purge's transaction
(``objects/ledger.sql``), so a finished key is never enqueued or sent again and
the audit still says what became of it; and its batch marker's
``effects_purged`` count, so reconciliation explains the rows that left. The
ledger forgets keys that finished before its own horizon
(``--forget-keys-older-than``, ``OUTBOX_RETENTION_FORGET_KEYS_AFTER``), set by an
operator longer than any replay: unset, keys are kept for ever.
What batches recorded of their result rows (``batch_result_rows``, reconciliation's
record) goes too once the batch is older than the cutoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.auditlog import SYSTEM_ACTOR, record_action
from spark_outbox.core.durations import describe_s
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.settings import MIN_RETENTION_PACE, Settings
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.dispatch.dbcalls import DbCalls

_Q = queries_beside(__file__, "retention.sql")
# The two ranges of finished effects retention deletes, each a partial index's: one
# statement (retention.sql, purge_batch) for both, a keyset pass each.
RANGES = {
    "purge_batch": "purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')",
    "purge_expired": "state = 'expired' AND purged_at IS NULL",
}
STATEMENTS = {
    step: sa.text(_Q["purge_batch"].text.format(finished=where)) for step, where in RANGES.items()
}
log = logging.getLogger(__name__)

MAX_BATCH_SIZE = 10_000
# Where a keyset pass starts: before every row.
START: tuple[Any, Any] = (dt.datetime.min.replace(tzinfo=dt.UTC), -1)


@dataclasses.dataclass(frozen=True)
class Purged:
    effects: int = 0
    attempts: int = 0
    keys: int = 0  # forgotten by the ledger's horizon
    batches: int = 0
    seconds: float = 0.0

    def plus(self, seconds: float, effects: int = 0, attempts: int = 0, keys: int = 0) -> Purged:
        return Purged(
            self.effects + effects,
            self.attempts + attempts,
            self.keys + keys,
            self.batches + 1,
            self.seconds + seconds,
        )


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch: what it removed and where it ended (the next batch starts after)."""

    removed: int
    attempts: int
    last: tuple[Any, Any] | None  # None: nothing was left


def cutoff_for(older_than_s: float, now: dt.datetime | None = None) -> dt.datetime:
    if older_than_s < 0:
        raise InvalidRequest("older_than", "is negative", "give a duration such as 30d")
    return (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=older_than_s)


def check_horizon(older_than_s: float, forget_after_s: float) -> None:
    """The ledger forgets only keys whose effects retention has deleted already."""
    if forget_after_s and forget_after_s < older_than_s:
        raise InvalidRequest(
            "forget_keys_older_than",
            f"{describe_s(forget_after_s)} is shorter than the purge's {describe_s(older_than_s)}",
            "forget keys later than effects are purged (e.g. 400d with 30d)",
        )


def count_purgeable(engine: Engine, cutoff: dt.datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(_Q["count_purgeable"], {"cutoff": cutoff}).scalar_one())


def count_forgettable(engine: Engine, horizon: dt.datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(_Q["count_forgettable"], {"bound": horizon}).scalar_one())


def purge_batch(
    engine: Engine,
    step: str,
    bound: dt.datetime,
    batch_size: int,
    after: tuple[Any, Any] = START,
) -> Batch:
    """One batch of a pass (``PASSES``), one transaction: rows past ``bound`` (the
    cutoff, or the ledger's horizon) after ``after`` (where the last batch ended)."""
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidRequest(
            "batch_size", f"{batch_size} is out of range", f"use 1 to {MAX_BATCH_SIZE}"
        )
    params = {"bound": bound, "batch_size": batch_size, "after_at": after[0], "after_id": after[1]}
    with engine.begin() as conn:
        if step == "forget_keys":  # a keyset on the finish time alone (retention.sql)
            edge = conn.execute(_Q["forget_keys_edge"], params).scalar_one()
            if edge is None:
                return Batch(0, 0, None)
            keys = conn.execute(_Q["forget_keys"], {**params, "edge": edge}).scalar_one()
            return Batch(int(keys), 0, (edge, None))
        row = conn.execute(STATEMENTS[step] if step in STATEMENTS else _Q[step], params).one()
    last = None if row.last_at is None else (row.last_at, row.last_id)
    return Batch(int(row.effects), int(row.attempts), last)


def purge_mismatches(engine: Engine, cutoff: dt.datetime) -> None:
    """enqueue()'s payload mismatches past the horizon (few rows: one statement)."""
    with engine.begin() as conn:
        conn.execute(_Q["purge_mismatches"], {"cutoff": cutoff})


def _passes(cutoff: dt.datetime, horizon: dt.datetime | None) -> list[tuple[str, dt.datetime]]:
    """(step, bound) of each pass, in order: finished effects, expired ones (a range
    of their own: ix_effects_purgeable predates the state), stubs, then the ledger's
    keys."""
    effects = [("purge_batch", cutoff), ("purge_expired", cutoff), ("purge_stubs", cutoff)]
    return effects + ([("forget_keys", horizon)] if horizon is not None else [])


def _counted(done: Purged, step: str, got: Batch, seconds: float) -> Purged:
    if step == "forget_keys":
        return done.plus(seconds, keys=got.removed)
    return done.plus(seconds, effects=got.removed, attempts=got.attempts)


def check_pace(pace: float, name: str) -> None:
    """A pace is the share of wall time a purge works: from 0.01 (a batch, then a
    rest 99 times as long) to 1. Smaller, the rest after a batch was for ever in effect
    (1e-9) or overflowed the sleep (1e-308)."""
    if not MIN_RETENTION_PACE <= pace <= 1:  # (NaN fails it too)
        raise InvalidRequest(
            name,
            f"{pace!r} is not a share of the time",
            f"use a number from {MIN_RETENTION_PACE:g} to 1: 1 purges as fast as it can, 0.25"
            " works a quarter of the time and rests the rest",
        )


def rest_after(worked_s: float, pace: float) -> float:
    """The rest after a batch that took ``worked_s``, so the purge works ``pace`` of the
    time: beside busy dispatchers a purge at full speed takes a core from them (on 2
    cores a drain ran at 0.65-0.77x beside it; bench/RESULTS.md, "Retention at a
    pace"). Never negative."""
    return max(0.0, worked_s) * (1.0 / pace - 1.0)


def purge(
    engine: Engine,
    cutoff: dt.datetime,
    batch_size: int,
    *,
    horizon: dt.datetime | None = None,
    on_batch: Callable[[Purged], None] | None = None,
    pace: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Purged:
    """Delete every finished effect older than ``cutoff``, batch after batch; then,
    with a ``horizon``, forget the ledger's keys that finished before it. Each batch
    is followed by a rest (``rest_after``) so the purge works ``pace`` of the time."""
    check_pace(pace, "pace")
    done = Purged()
    for step, bound in _passes(cutoff, horizon):
        after: tuple[Any, Any] | None = START
        while after is not None:
            started = time.perf_counter()
            got = purge_batch(engine, step, bound, batch_size, after)
            worked = time.perf_counter() - started
            if got.last is not None:
                done = _counted(done, step, got, worked)
                if on_batch is not None:
                    on_batch(done)
                if pace < 1.0:
                    sleep(rest_after(worked, pace))
            after = got.last
    purge_mismatches(engine, cutoff)
    while purge_result_rows(engine, cutoff, batch_size):
        pass
    return done


def purge_result_rows(engine: Engine, cutoff: dt.datetime, batch_size: int) -> int:
    """One batch of the result rows recorded by batches committed before ``cutoff``
    (reconciliation's record, ``batch_result_rows``): how many were deleted."""
    with engine.begin() as conn:
        params = {"cutoff": cutoff, "batch_size": batch_size}
        return int(conn.execute(_Q["purge_result_rows"], params).rowcount)


def record_purge(
    engine: Engine, done: Purged, older_than_s: float, actor: str, worker_id: str | None = None
) -> None:
    """The purge in the operators' audit trail (only when it removed something);
    ``worker_id``: the dispatcher that ran it, when the system did."""
    if done.effects == 0 and done.keys == 0:
        return
    details: dict[str, object] = dataclasses.asdict(done)
    if worker_id is not None:
        details["worker_id"] = worker_id
    with engine.begin() as conn:
        record_action(
            conn,
            actor=actor,
            action="purge",
            target=f"effects finished more than {describe_s(older_than_s)} ago",
            reason=f"retention: older than {describe_s(older_than_s)}",
            details=details,
        )


async def purge_once(db: DbCalls, settings: Settings, worker_id: str) -> None:
    """One round of the dispatcher's ``retention`` side task (``periodic.every`` runs
    it every interval): batch after batch until none is left, then its record, by
    the system (``SYSTEM_ACTOR``, the worker in its details), as every change the
    system makes by itself.

    One batch per store call, so a stopping worker cancels it between batches.
    """
    older_than_s, forget_s = settings.retention_older_than_s, settings.retention_forget_keys_after_s
    cutoff, done = cutoff_for(older_than_s), Purged()
    for step, bound in _passes(cutoff, cutoff_for(forget_s) if forget_s else None):
        after: tuple[Any, Any] | None = START
        while after is not None:
            started = time.perf_counter()
            got = await db.call(purge_batch, step, bound, settings.retention_batch_size, after)
            if got is None:
                return
            worked = time.perf_counter() - started
            if got.last is not None:
                done = _counted(done, step, got, worked)
                if settings.retention_pace < 1.0:  # yields to the drain (rest_after)
                    await asyncio.sleep(rest_after(worked, settings.retention_pace))
            after = got.last
    await db.call(purge_mismatches, cutoff)
    while await db.call(purge_result_rows, cutoff, settings.retention_batch_size):
        pass  # one batch per store call, as above
    await db.call(record_purge, done, older_than_s, SYSTEM_ACTOR, worker_id)
    log.info("retention purge", extra={"event": "retention.purged", **dataclasses.asdict(done)})
