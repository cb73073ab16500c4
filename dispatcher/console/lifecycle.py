"""Archive and unarchive an endpoint: retire it without losing its history.

An archived endpoint accepts no new effects: ``enqueue`` and the Spark sink
refuse them with ``ArchivedEndpoint``, which names it and says how to unarchive.
It is also paused, so no dispatcher claims for it, and keeps its effects,
attempts and audit rows, searchable on the support page and the API as before.

Effects still unfinished when it is archived: refused, not guessed at. Pending
ones block the archive unless ``cancel_pending`` cancels them in the same
transaction (each would otherwise wait forever for an endpoint nobody sends to);
leased ones are being sent right now, so the archive waits for them (try again
once their lease has ended). Each step is audited in the caller's transaction.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy.engine import Connection

from spark_outbox.core import endpoints, wakeup
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import Conflict, NotFound
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "lifecycle.sql")


@dataclasses.dataclass(frozen=True)
class Archived:
    endpoint: str
    cancelled: int  # pending effects cancelled with the archive (cancel_pending)


def archive(
    conn: Connection, name: str, *, cancel_pending: bool = False, actor: str, reason: str
) -> Archived:
    """Archive ``name``: steps in order, one transaction: lock the row, refuse an
    archived one, settle its unfinished effects, archive and pause it, audit."""
    reason = check_reason(reason)
    ep = _locked(conn, name)
    if ep.archived_at is not None:
        raise Conflict(f"endpoint {name!r} is already archived (since {ep.archived_at:%Y-%m-%d})")
    cancelled = _settle_unfinished(conn, name, cancel_pending)
    conn.execute(_Q["archive_endpoint"], {"name": name, "reason": reason})
    details = {
        "archived": {"old": False, "new": True},
        "enabled": {"old": ep.enabled, "new": False},
        "cancelled_pending": cancelled,
    }
    record_action(
        conn, actor=actor, action="archive_endpoint", target=name, reason=reason, details=details
    )
    return Archived(endpoint=name, cancelled=cancelled)


def unarchive(conn: Connection, name: str, *, actor: str, reason: str) -> endpoints.Endpoint:
    """Accept effects for ``name`` again, in the state it had before the archive:
    enabled, or paused with its earlier reason."""
    reason = check_reason(reason)
    ep = _locked(conn, name)
    if ep.archived_at is None:
        raise Conflict(f"endpoint {name!r} is not archived")
    conn.execute(_Q["unarchive_endpoint"], {"name": name})
    endpoints.reset_budget(conn, name)
    after = endpoints.get(conn, name)
    details = {
        "archived": {"old": True, "new": False},
        "enabled": {"old": ep.enabled, "new": after.enabled},
    }
    record_action(
        conn, actor=actor, action="unarchive_endpoint", target=name, reason=reason, details=details
    )
    wakeup.notify(conn, "resumed")
    return after


def _locked(conn: Connection, name: str) -> endpoints.Endpoint:
    """The endpoint, its row locked until the transaction ends (an enqueue that read
    it unarchived may still commit: see docs/dispatcher.md, "Archiving an endpoint")."""
    if conn.execute(_Q["lock_endpoint"], {"name": name}).first() is None:
        raise NotFound(f"no endpoint named {name!r}")
    return endpoints.get(conn, name)


def _settle_unfinished(conn: Connection, name: str, cancel_pending: bool) -> int:
    pending, leased = conn.execute(_Q["count_unfinished"], {"name": name}).one()
    cancelled = 0
    if pending and cancel_pending:
        cancelled = len(conn.execute(_Q["cancel_pending_of_endpoint"], {"name": name}).all())
    elif pending:
        raise Conflict(
            f"endpoint {name!r} has {pending} pending effect(s), which would never be sent; "
            "wait until they are delivered, or archive with --cancel-pending "
            "(API: cancel_pending true) to cancel them with the archive"
        )
    if leased:
        raise Conflict(
            f"endpoint {name!r} has {leased} effect(s) being sent right now; "
            "archive again once their lease has ended (seconds to minutes)"
        )
    return cancelled
