"""Retention: finished effects lose their payload and attempts after a while.

``outbox purge --older-than 30d`` runs it once; a dispatcher with
``OUTBOX_RETENTION_OLDER_THAN`` set runs it as its ``retention`` side task every
``OUTBOX_RETENTION_INTERVAL_S``. Work goes in small batches, each its own short
transaction locking only its rows (``FOR UPDATE SKIP LOCKED``): no table lock,
no long transaction, and several dispatchers purging at once share the work.

What batches recorded of their result rows (``batch_result_rows``, reconciliation's
record) goes too once the batch is older than the horizon.

A purged effect keeps a stub row (key, state, endpoint, batch, reference,
timestamps, ``purged_at``; payload ``{}``), so the API, the support page and
reconciliation still say what happened to the key, and its key is written to
``key_ledger`` with the final state: a finished key is never enqueued again.

The stub's ``last_error`` is outside text that may echo the payload (a receiver's
"card 4111... declined"); the support role's view masks it with the values the
payload holds at ``OUTBOX_SENSITIVE_FIELDS`` (``spark_outbox.core.masking``), which
the purge drops. So the purge masks it first, in the same transaction, with the
payload it is about to drop: what retention removes is gone from every view.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.core import masking
from spark_outbox.core.auditlog import SYSTEM_ACTOR, record_action
from spark_outbox.core.durations import describe_s
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.settings import Settings
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.dispatch.dbcalls import DbCalls

_Q = queries_beside(__file__, "retention.sql")
log = logging.getLogger(__name__)

MAX_BATCH_SIZE = 10_000


@dataclasses.dataclass(frozen=True)
class Purged:
    effects: int = 0
    attempts: int = 0
    batches: int = 0
    seconds: float = 0.0

    def plus(self, effects: int, attempts: int, seconds: float) -> Purged:
        seconds += self.seconds
        return Purged(self.effects + effects, self.attempts + attempts, self.batches + 1, seconds)


def cutoff_for(older_than_s: float, now: dt.datetime | None = None) -> dt.datetime:
    if older_than_s < 0:
        raise InvalidRequest("older_than", "is negative", "give a duration such as 30d")
    return (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=older_than_s)


def count_purgeable(engine: Engine, cutoff: dt.datetime) -> int:
    with engine.connect() as conn:
        return int(conn.execute(_Q["count_purgeable"], {"cutoff": cutoff}).scalar_one())


def purge_batch(
    engine: Engine, cutoff: dt.datetime, batch_size: int, sensitive: Sequence[str] = ()
) -> tuple[int, int]:
    """One batch, one transaction: (effects purged, attempts deleted). ``sensitive``:
    the payload paths whose values are masked in the purged rows' ``last_error``."""
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidRequest(
            "batch_size", f"{batch_size} is out of range", f"use 1 to {MAX_BATCH_SIZE}"
        )
    with engine.begin() as conn:
        params = {"cutoff": cutoff, "batch_size": batch_size, "masking": bool(sensitive)}
        row = conn.execute(_Q["purge_batch"], params).one()
        scrubbed = _scrubbed(row.errors or [], sensitive)
        if scrubbed:
            ids, errors = zip(*scrubbed, strict=True)
            conn.execute(_Q["scrub_errors"], {"ids": list(ids), "errors": list(errors)})
    return int(row.effects), int(row.attempts)


def _scrubbed(errors: list[list[Any]], sensitive: Sequence[str]) -> list[tuple[int, str]]:
    """(id, masked last_error) of the rows whose text masking changes."""
    changed = []
    for effect_id, payload, text in errors:
        values = masking.masked_values(payload, sensitive)
        masked = masking.mask_text(text, sensitive, values)
        if masked != text:
            changed.append((int(effect_id), str(masked)))
    return changed


def purge(
    engine: Engine,
    cutoff: dt.datetime,
    batch_size: int,
    *,
    sensitive: Sequence[str] = (),
    on_batch: Callable[[Purged], None] | None = None,
) -> Purged:
    """Purge every finished effect older than ``cutoff``, batch after batch."""
    done = Purged()
    while True:
        started = time.perf_counter()
        effects, attempts = purge_batch(engine, cutoff, batch_size, sensitive)
        if effects == 0:
            purge_mismatches(engine, cutoff)
            while purge_result_rows(engine, cutoff, batch_size):
                pass
            return done
        done = done.plus(effects, attempts, time.perf_counter() - started)
        if on_batch is not None:
            on_batch(done)


def purge_mismatches(engine: Engine, cutoff: dt.datetime) -> None:
    """enqueue()'s payload mismatches past the horizon (few rows: one statement)."""
    with engine.begin() as conn:
        conn.execute(_Q["purge_mismatches"], {"cutoff": cutoff})


def purge_result_rows(engine: Engine, cutoff: dt.datetime, batch_size: int) -> int:
    """One batch of the result rows recorded by batches committed before ``cutoff``
    (reconciliation's record, ``batch_result_rows``): how many were deleted."""
    with engine.begin() as conn:
        params = {"cutoff": cutoff, "batch_size": batch_size}
        return int(conn.execute(_Q["purge_result_rows"], params).rowcount)


def record_purge(
    engine: Engine, done: Purged, older_than_s: float, actor: str, worker_id: str | None = None
) -> None:
    """The purge in the operators' audit trail (only when it purged something);
    ``worker_id``: the dispatcher that ran it, when the system did."""
    if done.effects == 0:
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
    older_than_s = settings.retention_older_than_s
    cutoff, done = cutoff_for(older_than_s), Purged()
    while True:
        started = time.perf_counter()
        got = await db.call(
            purge_batch, cutoff, settings.retention_batch_size, settings.sensitive_fields
        )
        if not got or got[0] == 0:
            break
        done = done.plus(got[0], got[1], time.perf_counter() - started)
    await db.call(purge_mismatches, cutoff)
    while await db.call(purge_result_rows, cutoff, settings.retention_batch_size):
        pass  # one batch per store call, as above
    await db.call(record_purge, done, older_than_s, SYSTEM_ACTOR, worker_id)
    log.info(
        "retention purge",
        extra={"event": "retention.purged", **dataclasses.asdict(done)},
    )
