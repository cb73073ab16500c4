"""Erasure: one person's data out of the outbox, keeping what the guarantees need.

A person is selected by their recipient, a business reference, or a payload
field's value (``customer.id`` = ``42``). ``erase`` then, in this order:

1. checks the input and writes the ``erase`` row of ``operator_actions`` (the
   reason with the person's value blanked: the record never repeats the data);
2. blanks the person's rejects (raw row and reason), ``batch_size`` per short
   transaction; first, so that a requeue of rejects racing the erasure either
   finds them blank or enqueued its effects before step 3 looks;
3. erases the person's effects, batch by batch: payload, recipient, reference,
   ordering key and error go, the attempts' receiver excerpts and errors go; an
   unsent effect (pending, held, uncertain) is cancelled; every key goes to
   ``key_ledger``, so it is never sent again;
4. blanks the value where the audit trail quotes it (an operator's reason, a
   bulk requeue's filter), page by page: the one rewrite its trigger allows;
5. writes the ``erased`` row with the counts.

An effect being sent right now (``leased``) is left alone: its lease token
fences it, and its worker's record would otherwise write the receiver's answer
after the erasure. So are effects of a Spark run that has not committed and
the staging of runs in flight (``deferred_effects``, ``staged_results``,
``staged_rejects``): erasing under a run would change what it commits. All are
counted as ``in_flight``; the same erase run again once they finished (a
lease ends within ``OUTBOX_LEASE_S``) erases them. ``preview`` is the dry run:
it changes nothing and lists what would change.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection, Engine

from spark_outbox.console import subjects
from spark_outbox.console.subjects import Person
from spark_outbox.core import db
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "erasure.sql")

MAX_BATCH_SIZE = 10_000
MAX_LISTED = 100
_SCAN = 1000  # rows a dry-run read or an audit scan takes at a time

# What an erased effect keeps in last_error: the resend refuses such an effect by it
# (its payload is gone, and must stay gone).
ERASED_NOTE = "erased (operator action {action_id})"
ERASED_PREFIX = ERASED_NOTE.split("{", 1)[0]


@dataclasses.dataclass(frozen=True)
class Listed:
    idempotency_key: str
    endpoint: str
    state: str
    plan: str  # erase | cancel (unsent: cancelled, then erased) | in_flight (left for now)


@dataclasses.dataclass(frozen=True)
class Erasure:
    by: str  # recipient | reference | payload <path>
    dry_run: bool
    effects: int  # erased (or, on a dry run, would be)
    cancelled: int  # of those, unsent ones cancelled
    attempts: int  # attempts whose excerpt and error were blanked
    rejects: int
    audit_rows: int  # operator_actions rows whose quote of the value was blanked
    in_flight: int  # being sent, or of a run in flight (staging too): left; erase again
    listed: list[Listed]  # the dry run's list (at most MAX_LISTED)
    action_id: int | None = None  # the erase row in operator_actions

    @property
    def complete(self) -> bool:
        return self.in_flight == 0


def preview(conn: Connection, who: Person) -> Erasure:
    """The dry run: what ``erase`` would change, nothing changed."""
    listed: list[Listed] = []
    effects = cancelled = in_flight = attempts = 0
    after = 0
    while True:
        rows = _matching_effects(conn, who, after, _SCAN)
        if not rows:
            break
        after = rows[-1].id
        erasable = [r.id for r in rows if r.plan != "in_flight"]
        effects += len(erasable)
        cancelled += sum(r.plan == "cancel" for r in rows)
        in_flight += sum(r.plan == "in_flight" for r in rows)
        if erasable:
            attempts += int(conn.execute(_Q["count_attempts"], {"ids": erasable}).scalar_one())
        room = MAX_LISTED - len(listed)
        listed += [Listed(r.idempotency_key, r.endpoint, r.state, r.plan) for r in rows[:room]]
    in_flight += _staged(conn, who)
    rejects = sum(len(ids) for ids in _reject_batches(conn, who, _SCAN))
    audit_rows = _count_quotes(conn, who)
    _refuse_unknown_path(conn, who, effects + in_flight + rejects)
    return Erasure(
        who.by, True, effects, cancelled, attempts, rejects, audit_rows, in_flight, listed
    )


def run(
    engine: Engine,
    who: Person,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    batch_size: int = 1000,
) -> Erasure:
    """The dry run (``preview``) or the erasure: what the CLI and the API call."""
    reason = check_reason(reason)
    with db.translated():
        if dry_run:
            with engine.connect() as conn:
                return preview(conn, who)
        return erase(engine, who, actor=actor, reason=reason, batch_size=batch_size)


def erase(
    engine: Engine,
    who: Person,
    *,
    actor: str,
    reason: str,
    batch_size: int = 1000,
    on_batch: Callable[[int], None] | None = None,
) -> Erasure:
    """Erase the person (the module's steps), each batch its own short transaction."""
    reason = check_reason(reason)
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidRequest(
            "batch_size", f"{batch_size} is out of range", f"use 1 to {MAX_BATCH_SIZE}"
        )
    with engine.begin() as conn:
        planned = preview(conn, who)
        action_id = record_action(
            conn,
            actor=actor,
            action="erase",
            target=f"a person, by {who.by}",
            reason=subjects.redact(reason, who.value),
            details={"by": who.by, "planned": _counts(planned)},
        )
    note = ERASED_NOTE.format(action_id=action_id)
    rejects = _erase_rejects(engine, who, note, batch_size)
    effects, cancelled, attempts = _erase_effects(engine, who, note, batch_size, on_batch)
    audit_rows = _redact_audit(engine, who, action_id, batch_size)
    with engine.begin() as conn:
        in_flight = len(_matching_effects(conn, who, 0, _SCAN)) + _staged(conn, who)
        done = Erasure(
            who.by,
            False,
            effects,
            cancelled,
            attempts,
            rejects,
            audit_rows,
            in_flight,
            [],
            action_id,
        )
        record_action(
            conn,
            actor=actor,
            action="erased",
            target=f"erasure {action_id}",
            reason=f"erasure {action_id} finished",
            details=_counts(done),
        )
    return done


def _counts(done: Erasure) -> dict[str, int]:
    names = ("effects", "cancelled", "attempts", "rejects", "audit_rows", "in_flight")
    return {n: getattr(done, n) for n in names}


def _matching_effects(conn: Connection, who: Person, after: int, limit: int) -> list[Any]:
    params = who.params() | {"after_id": after, "limit": limit}
    return list(conn.execute(_Q["matching_effects"], params))


def _staged(conn: Connection, who: Person) -> int:
    return int(conn.execute(_Q["staged_matches"], who.params()).scalar_one())


def _erase_effects(
    engine: Engine,
    who: Person,
    note: str,
    batch_size: int,
    on_batch: Callable[[int], None] | None,
) -> tuple[int, int, int]:
    effects = cancelled = attempts = after = 0
    while True:
        params = who.params() | {"after_id": after, "batch_size": batch_size, "note": note}
        with engine.begin() as conn:
            row = conn.execute(_Q["erase_effects"], params).one()
        if not row.effects:
            return effects, cancelled, attempts
        effects, after = effects + row.effects, row.last_id
        cancelled += row.cancelled
        attempts += row.attempts
        if on_batch is not None:
            on_batch(effects)


def _reject_batches(conn: Connection, who: Person, limit: int) -> Any:
    after = 0
    while True:
        params = who.params() | {"after_id": after, "limit": limit}
        ids = [r.id for r in conn.execute(_Q["matching_rejects"], params)]
        if not ids:
            return
        yield ids
        after = ids[-1]


def _erase_rejects(engine: Engine, who: Person, note: str, batch_size: int) -> int:
    done = after = 0
    while True:
        with engine.begin() as conn:
            params = who.params() | {"after_id": after, "limit": batch_size}
            ids = [r.id for r in conn.execute(_Q["matching_rejects"], params)]
            if not ids:
                return done
            conn.execute(_Q["erase_rejects"], {"ids": ids, "note": note})
        done, after = done + len(ids), ids[-1]


Quote = tuple[int, str, str, Any]  # an audit row's id, target, reason, details: blanked


def _quoting_page(conn: Connection, who: Person, after: int, limit: int) -> tuple[list[Quote], int]:
    """The next page of audit rows (ids above ``after``) that quote the value as a
    whole word, with the quotes blanked; and where the page ended (``after`` if none)."""
    needle = who.value
    params = {
        "needle": needle,
        "escaped": json.dumps(needle, ensure_ascii=False)[1:-1],
        "after_id": after,
        "limit": limit,
    }
    rows = list(conn.execute(_Q["quoting_actions"], params))
    quotes: list[Quote] = []
    for r in rows:
        target, reason = subjects.redact(r.target, needle), subjects.redact(r.reason, needle)
        details = subjects.redact_json(r.details, needle)
        if (target, reason, details) != (r.target, r.reason, r.details):
            quotes.append((r.id, target, reason, details))
    return quotes, rows[-1].id if rows else after


def _count_quotes(conn: Connection, who: Person) -> int:
    count = after = 0
    while True:
        quotes, last = _quoting_page(conn, who, after, _SCAN)
        if last == after:
            return count
        count, after = count + len(quotes), last


def _redact_audit(engine: Engine, who: Person, action_id: int, batch_size: int) -> int:
    """Blank the quotes page by page, each page its own transaction, which the audit
    trail's trigger lets rewrite target, reason and details for this erasure only."""
    done = after = 0
    while True:
        with engine.begin() as conn:
            quotes, last = _quoting_page(conn, who, after, batch_size)
            if last == after:
                return done
            if quotes:
                conn.execute(_Q["allow_redaction"], {"id": action_id})
            for row_id, target, reason, details in quotes:
                params = {"id": row_id, "target": target, "reason": reason}
                conn.execute(_Q["redact_action"], params | {"details": json.dumps(details)})
        done, after = done + len(quotes), last


def _refuse_unknown_path(conn: Connection, who: Person, matched: int) -> None:
    if who.payload_path is None or matched:
        return
    if not conn.execute(_Q["path_known"], who.params()).scalar_one():
        raise InvalidRequest(
            "payload_field",
            f"no effect's payload and no reject has the field {who.payload_path!r}",
            "check the path's spelling: dotted, from the payload's top, e.g. customer.id",
        )
