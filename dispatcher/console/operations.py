"""Operator actions: requeue, cancel, pause, resume, bulk requeue, recover; each audited.

Every action writes its ``operator_actions`` row in the same transaction as the
change itself, so there is no change without its record and no record of a
change that did not happen. Invalid transitions raise ``Conflict``, unknown
targets ``NotFound``; the caller's transaction then rolls back both.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console import audit
from spark_outbox.console.filters import EffectFilter
from spark_outbox.core import endpoints, timestamps, wakeup
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.core.timestamps import iso

_Q = queries_beside(__file__, "operations.sql")
log = logging.getLogger(__name__)

MAX_BULK_CAP = 10_000


@dataclasses.dataclass(frozen=True)
class BulkRequeue:
    matched: int  # dead effects matching the filter (counted up to cap + 1)
    requeued: int  # 0 on a dry run
    dry_run: bool
    cap: int

    @property
    def over_cap(self) -> bool:
        """More match than ``cap``: ``matched`` is then cap + 1, not the true count."""
        return self.matched > self.cap


def check_cap(cap: int) -> int:
    """A bulk action's cap: 1 to MAX_BULK_CAP."""
    if not 1 <= cap <= MAX_BULK_CAP:
        raise InvalidRequest("cap", f"{cap} is out of range", f"use 1 to {MAX_BULK_CAP}")
    return cap


def _refuse(conn: Connection, key: str, wanted: str, verb: str) -> Conflict | NotFound:
    state = conn.execute(_Q["effect_state"], {"key": key}).scalar()
    if state is None:
        return audit.not_found(conn, key)
    return Conflict(f"effect {key} is {state}; only a {wanted} effect can be {verb}")


def requeue(
    conn: Connection,
    key: str,
    *,
    actor: str,
    reason: str,
    expires_at: dt.datetime | None = None,
) -> None:
    """A dead or expired effect goes back to pending. ``expires_at``: a new send-by
    time; needed when its own has passed (an expired one's always has): requeued
    without one it would expire again unsent (docs/operations.md, "Send-by times")."""
    reason = check_reason(reason)
    params = {"key": key, "expires_at": _future("expires_at", expires_at)}
    if conn.execute(_Q["requeue_dead"], params).first() is None:
        passed = conn.execute(_Q["send_by_passed"], {"key": key}).scalar()
        if passed is not None:
            raise InvalidRequest(
                "expires_at",
                f"the effect's send-by time {iso(passed)} has passed: requeued as it is, it "
                "would expire again, unsent",
                "give a new send-by time in the future if it is still worth sending "
                "(--expires-at, or expires_at in the request)",
            )
        raise _refuse(conn, key, "dead or expired", "requeued")
    details = {"expires_at": iso(expires_at)} if expires_at is not None else None
    record_action(conn, actor=actor, action="requeue", target=key, reason=reason, details=details)
    wakeup.notify(conn, "requeued")


def _future(field: str, at: dt.datetime | None) -> dt.datetime | None:
    """An optional instant an operator gives: with a zone, and ahead of now."""
    if at is None:
        return None
    if at.tzinfo is None:
        raise InvalidRequest(field, f"{at.isoformat()} has no time zone", "append Z or +01:00")
    at = timestamps.utc(field, at)  # what PostgreSQL takes (offsets to 15:59 only)
    if at <= dt.datetime.now(dt.UTC):
        raise InvalidRequest(field, f"{iso(at)} is not in the future", "give a later time")
    return at


def cancel(conn: Connection, key: str, *, actor: str, reason: str) -> None:
    reason = check_reason(reason)
    if conn.execute(_Q["cancel_pending"], {"key": key}).first() is None:
        raise _refuse(conn, key, "pending", "cancelled")
    record_action(conn, actor=actor, action="cancel", target=key, reason=reason)


def pause_endpoint(conn: Connection, name: str, *, actor: str, reason: str) -> None:
    reason = check_reason(reason)
    endpoints.pause(conn, name, reason)
    record_action(conn, actor=actor, action="pause_endpoint", target=name, reason=reason)


def resume_endpoint(conn: Connection, name: str, *, actor: str, reason: str) -> None:
    reason = check_reason(reason)
    endpoints.resume(conn, name)
    record_action(conn, actor=actor, action="resume_endpoint", target=name, reason=reason)


def bulk_requeue(
    conn: Connection, flt: EffectFilter, *, cap: int, dry_run: bool, actor: str, reason: str
) -> BulkRequeue:
    """Requeue the dead effects a filter matches, refusing (409) more than ``cap``.

    The dry run only counts, so an operator sees the blast radius first.
    """
    reason = check_reason(reason)
    params = flt.params()
    queries = ("count_dead_matching", "bulk_requeue_dead")
    done, keys = _capped_requeue(conn, queries, params, cap=cap, dry_run=dry_run)
    if not dry_run:
        details = {"filter": params, "requeued": len(keys), "keys": keys[:100]}
        record_action(
            conn,
            actor=actor,
            action="bulk_requeue",
            target=_describe(flt),
            reason=reason,
            details=details,
        )
    return done


def recover_endpoint(
    conn: Connection,
    name: str,
    *,
    since: dt.datetime,
    cap: int,
    dry_run: bool,
    actor: str,
    reason: str,
) -> BulkRequeue:
    """Requeue an endpoint's effects that died since ``since`` (it is back up).

    Capped and counted first like ``bulk_requeue``; purged effects are left dead.
    """
    reason = check_reason(reason)
    if since.tzinfo is None:
        raise InvalidRequest("since", "has no time zone", "append Z or an offset like +01:00")
    since = timestamps.utc("since", since)  # what PostgreSQL takes (offsets to 15:59 only)
    endpoints.get(conn, name)  # NotFound for an unknown name
    params = {"endpoint": name, "since": since}
    queries = ("count_dead_of_endpoint", "recover_dead_of_endpoint")
    done, keys = _capped_requeue(conn, queries, params, cap=cap, dry_run=dry_run)
    if not dry_run:
        details = {"since": since.isoformat(), "requeued": len(keys), "keys": keys[:100]}
        action = "recover_endpoint"
        record_action(conn, actor=actor, action=action, target=name, reason=reason, details=details)
    return done


def _capped_requeue(
    conn: Connection, queries: tuple[str, str], params: dict[str, Any], *, cap: int, dry_run: bool
) -> tuple[BulkRequeue, list[str]]:
    """Count (up to cap + 1), then requeue unless a dry run or over the cap."""
    check_cap(cap)
    count, update = queries
    matched = int(conn.execute(_Q[count], params | {"cap_plus_one": cap + 1}).scalar() or 0)
    if dry_run:
        return BulkRequeue(matched=matched, requeued=0, dry_run=True, cap=cap), []
    if matched > cap:
        raise Conflict(
            f"more than {cap} dead effects match; narrow the filter or raise cap "
            f"(at most {MAX_BULK_CAP})"
        )
    keys = [row[0] for row in conn.execute(_Q[update], params)]
    if len(keys) > cap:  # rows died between the count and the update
        raise Conflict(f"{len(keys)} dead effects match now, more than cap {cap}; try again")
    if keys:
        wakeup.notify(conn, "requeued")
    return BulkRequeue(matched=len(keys), requeued=len(keys), dry_run=False, cap=cap), keys


def _describe(flt: EffectFilter) -> str:
    parts = [f"{k}={v}" for k, v in dataclasses.asdict(flt).items() if v is not None]
    return " ".join(str(p) for p in parts)
