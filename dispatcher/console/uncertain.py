"""Uncertain effects: a send to an endpoint that cannot deduplicate started and its
outcome is unknown (docs/dispatcher.md, "Uncertain sends"). Nothing resends them;
an operator looks (did the customer get the e-mail?) and decides:

- ``mark_delivered``: delivered, and the key ledger records it as a delivery does;
- ``send_again``: pending, due now (the receiver may then have it twice: the
  operator's call, on the record); not once its send-by time has passed.

Both take a reason, can be tried first as a dry run, and write their
``operator_actions`` row in the transaction of the change. Race-safe: the row is
locked and must still be uncertain (else ``Conflict``, a 409).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from spark_outbox.console.audit import from_row
from spark_outbox.console.operations import MAX_BULK_CAP, check_cap
from spark_outbox.core import endpoints, masking, wakeup
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.core.timestamps import iso

_Q = queries_beside(__file__, "uncertain.sql")

ACTIONS = ("mark_delivered", "send_again")


@dataclasses.dataclass(frozen=True)
class UncertainEffect:
    idempotency_key: str
    endpoint: str
    recipient: str | None
    reference: str | None
    attempt_count: int
    send_started_at: dt.datetime | None
    updated_at: dt.datetime
    last_error: str | None
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class Resolution:
    action: str  # mark_delivered | send_again
    target: str  # the key, or the endpoint of a bulk resolve
    effects: int  # resolved (or, on a dry run, that would be)
    dry_run: bool


def listed(
    conn: Connection, *, limit: int = 100, mask: Sequence[str] = ()
) -> list[UncertainEffect]:
    """Oldest first; ``mask``: the support role's view (``last_error`` may repeat a
    receiver's text, masked with the effect's own payload as the audit does)."""
    found = []
    for row in conn.execute(_Q["uncertain_effects"], {"limit": limit}).mappings():
        effect = from_row(UncertainEffect, row)
        if mask:
            values = masking.masked_values(row["payload"], mask)
            error = masking.mask_text(effect.last_error, mask, values)
            effect = dataclasses.replace(effect, last_error=error)
        found.append(effect)
    return found


def count(conn: Connection) -> int:
    return int(conn.execute(_Q["uncertain_count"]).scalar_one())


def _check_action(action: str) -> None:
    if action not in ACTIONS:
        raise InvalidRequest(
            "action", f"{action!r} is not a resolution", "use mark_delivered or send_again"
        )


def resolve(
    conn: Connection, key: str, action: str, *, actor: str, reason: str, dry_run: bool
) -> Resolution:
    """Resolve one uncertain effect (a dry run checks it could, and changes nothing)."""
    _check_action(action)
    reason = check_reason(reason)
    row = conn.execute(_Q["uncertain_state"], {"key": key}).first()
    if row is None:
        raise NotFound(f"no effect with key {key!r}")
    if row.state != "uncertain":
        verb = "marked delivered" if action == "mark_delivered" else "sent again"
        raise Conflict(f"effect {key} is {row.state}; only an uncertain effect can be {verb}")
    if action == "send_again" and row.send_by_passed is not None:
        raise Conflict(
            f"effect {key}'s send-by time {iso(row.send_by_passed)} has passed: it is not "
            "sent again; mark it delivered if the receiver has it, or leave it uncertain"
        )
    if not dry_run:
        _apply(conn, [key], action)
        details = {"endpoint": row.endpoint}
        record_action(conn, actor=actor, action=action, target=key, reason=reason, details=details)
    return Resolution(action=action, target=key, effects=1, dry_run=dry_run)


def resolve_endpoint(
    conn: Connection,
    name: str,
    action: str,
    *,
    cap: int,
    actor: str,
    reason: str,
    dry_run: bool,
) -> Resolution:
    """Resolve every uncertain effect of one endpoint, refusing (409) more than ``cap``."""
    _check_action(action)
    reason = check_reason(reason)
    check_cap(cap)
    endpoints.get(conn, name)  # NotFound for an unknown name
    params = {"endpoint": name, "cap_plus_one": cap + 1, "action": action}
    keys = [r[0] for r in conn.execute(_Q["uncertain_of_endpoint"], params)]
    if len(keys) > cap:
        raise Conflict(
            f"more than {cap} uncertain effects of {name}; raise cap (at most {MAX_BULK_CAP})"
        )
    if not dry_run and keys:
        _apply(conn, keys, action)
        details = {"resolved": len(keys), "keys": keys[:100]}
        action_name = f"{action}_endpoint"
        record_action(
            conn, actor=actor, action=action_name, target=name, reason=reason, details=details
        )
    return Resolution(action=action, target=name, effects=len(keys), dry_run=dry_run)


def _apply(conn: Connection, keys: list[str], action: str) -> None:
    done = conn.execute(_Q[action], {"keys": keys}).all()
    if len(done) != len(keys):  # cannot happen: the rows are locked and uncertain
        raise Conflict("an effect changed while being resolved; try again")
    if action == "send_again":
        wakeup.notify(conn, "sent again")
