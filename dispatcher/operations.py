"""Operator actions: requeue, cancel, pause, resume, bulk requeue; each one audited.

Every action writes its ``operator_actions`` row in the same transaction as the
change itself, so there is no change without its record and no record of a
change that did not happen. Invalid transitions raise ``Conflict``, unknown
targets ``NotFound``; the caller's transaction then rolls back both.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from sqlalchemy.engine import Connection

from dispatcher import endpoints, wakeup
from dispatcher.errors import Conflict, InvalidRequest, NotFound
from dispatcher.filters import EffectFilter
from dispatcher.sqlfile import queries_beside

_Q = queries_beside(__file__, "operations.sql")
log = logging.getLogger(__name__)

MAX_BULK_CAP = 10_000


@dataclasses.dataclass(frozen=True)
class BulkRequeue:
    matched: int  # dead effects matching the filter (counted up to cap + 1)
    requeued: int  # 0 on a dry run
    dry_run: bool
    cap: int


def _reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise InvalidRequest("reason", "is empty", "say why, e.g. 'receiver fixed, ticket 4711'")
    if "\x00" in reason:
        raise InvalidRequest("reason", "contains a NUL character", "send plain text")
    return reason.strip()


def record_action(
    conn: Connection,
    *,
    actor: str,
    action: str,
    target: str,
    reason: str,
    details: dict[str, Any] | None = None,
) -> int:
    params = {
        "actor": actor,
        "action": action,
        "target": target,
        "reason": _reason(reason),
        "details": json.dumps(details or {}, default=str),
    }
    action_id = int(conn.execute(_Q["record_action"], params).scalar_one())
    log.info(
        "operator action",
        extra={
            "event": f"operator.{action}",
            "actor": actor,
            "target": target,
            "action_id": action_id,
        },
    )
    return action_id


def _refuse(conn: Connection, key: str, wanted: str, verb: str) -> Conflict | NotFound:
    state = conn.execute(_Q["effect_state"], {"key": key}).scalar()
    if state is None:
        return NotFound(f"no effect with key {key!r}")
    return Conflict(f"effect {key} is {state}; only a {wanted} effect can be {verb}")


def requeue(conn: Connection, key: str, *, actor: str, reason: str) -> None:
    reason = _reason(reason)
    if conn.execute(_Q["requeue_dead"], {"key": key}).first() is None:
        raise _refuse(conn, key, "dead", "requeued")
    record_action(conn, actor=actor, action="requeue", target=key, reason=reason)
    wakeup.notify(conn, "requeued")


def cancel(conn: Connection, key: str, *, actor: str, reason: str) -> None:
    reason = _reason(reason)
    if conn.execute(_Q["cancel_pending"], {"key": key}).first() is None:
        raise _refuse(conn, key, "pending", "cancelled")
    record_action(conn, actor=actor, action="cancel", target=key, reason=reason)


def pause_endpoint(conn: Connection, name: str, *, actor: str, reason: str) -> None:
    reason = _reason(reason)
    endpoints.pause(conn, name, reason)
    record_action(conn, actor=actor, action="pause_endpoint", target=name, reason=reason)


def resume_endpoint(conn: Connection, name: str, *, actor: str, reason: str) -> None:
    reason = _reason(reason)
    endpoints.resume(conn, name)
    record_action(conn, actor=actor, action="resume_endpoint", target=name, reason=reason)


def bulk_requeue(
    conn: Connection, flt: EffectFilter, *, cap: int, dry_run: bool, actor: str, reason: str
) -> BulkRequeue:
    """Requeue the dead effects a filter matches, refusing (409) more than ``cap``.

    The dry run only counts, so an operator sees the blast radius first.
    """
    reason = _reason(reason)
    if not 1 <= cap <= MAX_BULK_CAP:
        raise InvalidRequest("cap", f"{cap} is out of range", f"use 1 to {MAX_BULK_CAP}")
    params = flt.params()
    matched = conn.execute(_Q["count_dead_matching"], params | {"cap_plus_one": cap + 1}).scalar()
    matched = int(matched or 0)
    if dry_run:
        return BulkRequeue(matched=matched, requeued=0, dry_run=True, cap=cap)
    if matched > cap:
        raise Conflict(
            f"more than {cap} dead effects match; narrow the filter or raise cap "
            f"(at most {MAX_BULK_CAP})"
        )
    keys = [row[0] for row in conn.execute(_Q["bulk_requeue_dead"], params)]
    if len(keys) > cap:  # rows died between the count and the update
        raise Conflict(f"{len(keys)} dead effects match now, more than cap {cap}; try again")
    record_action(
        conn,
        actor=actor,
        action="bulk_requeue",
        target=_describe(flt),
        reason=reason,
        details={"filter": params, "requeued": len(keys), "keys": keys[:100]},
    )
    if keys:
        wakeup.notify(conn, "requeued")
    return BulkRequeue(matched=len(keys), requeued=len(keys), dry_run=False, cap=cap)


def _describe(flt: EffectFilter) -> str:
    parts = [f"{k}={v}" for k, v in dataclasses.asdict(flt).items() if v is not None]
    return " ".join(str(p) for p in parts)
