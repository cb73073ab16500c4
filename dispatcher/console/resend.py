"""Resend on request: an operator sends a delivered (or dead) effect again.

A customer's receiver lost what we delivered (a restore from backup, a bug on
their side), or a dead effect's cause is fixed: the operator resends it, with a
reason. The effect becomes pending, due now, tagged with the ``operator_actions``
row of the resend (``effects.resend_action_id``); the dispatchers send it as any
other, under a lease, within the endpoint's rate and in-flight limits and its
key's order, with the same idempotency key on the wire. The claim sends it
although the key ledger knows the key delivered (that "never again" is for sends
on our own account: a resend is the operator's), and every attempt of it carries
the action's id, so the timeline shows it as a resend, never as a duplicate.

Refused, with the reason: an effect that is not delivered or dead (pending and
leased ones are being sent anyway; an uncertain one is resolved instead; a
cancelled one must never go), one whose payload is gone (erased, or purged by
retention), one whose endpoint is archived or unregistered, one past its
send-by time (it would only expire). A paused endpoint's resend waits, pending,
for its resume. Bulk: by a filter (a batch, an endpoint in a window, a recipient,
a reference), capped, counted first; the API's dry run is the default, as for
bulk requeue.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console.erasure import ERASED_PREFIX
from spark_outbox.console.filters import EffectFilter
from spark_outbox.console.operations import MAX_BULK_CAP, check_cap
from spark_outbox.core import wakeup
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.endpoints import unarchive_hint
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.core.timestamps import iso

_Q = queries_beside(__file__, "resend.sql")
_FILTER = ("state", "since", "until", "job", "batch_id", "endpoint", "recipient", "reference")

RESENDABLE = ("delivered", "dead")
_NOT_NOW = {
    "pending": "it is waiting to be sent already",
    "leased": "it is being sent right now",
    "cancelled": "an operator cancelled it: it must never be sent",
    "uncertain": "resolve it instead (outbox effects resolve KEY --send-again or "
    "--mark-delivered; POST /v1/effects/{key}/resolve)",
    "expired": "its send-by time passed before it was sent; requeue it with a new one if it "
    "is still worth sending (outbox effects requeue KEY --expires-at ...)",
}


@dataclasses.dataclass(frozen=True)
class Resend:
    """What a resend did (or, on a dry run, would do)."""

    target: str  # the key, or the filter of a bulk resend
    matched: int  # effects that can be sent again (a bulk's counted up to cap + 1)
    resent: int  # 0 on a dry run
    paused: int  # of the matched, waiting for their paused endpoint's resume
    refused: dict[str, int]  # reason -> delivered or dead effects that cannot be sent again
    dry_run: bool
    cap: int
    action_id: int | None  # the operator_actions row (None on a dry run)

    @property
    def over_cap(self) -> bool:
        """More match than ``cap``: nothing was done, and ``matched`` is cap + 1."""
        return self.matched > self.cap


def resend(conn: Connection, key: str, *, actor: str, reason: str, dry_run: bool) -> Resend:
    """Send one delivered or dead effect again (a dry run checks it could)."""
    reason = check_reason(reason)
    row = conn.execute(_Q["resend_candidate"], {"key": key}).mappings().first()
    if row is None:
        raise _unknown(conn, key)
    _check_one(key, row)
    paused = 0 if row["enabled"] else 1
    if dry_run:
        return Resend(key, 1, 0, paused, {}, True, 1, None)
    details = {"endpoint": row["endpoint"], "was": row["state"]}
    action_id = record_action(
        conn, actor=actor, action="resend", target=key, reason=reason, details=details
    )
    _apply(conn, [row["id"]], action_id)
    return Resend(key, 1, 1, paused, {}, False, 1, action_id)


def bulk_resend(
    conn: Connection,
    flt: EffectFilter,
    *,
    cap: int,
    dry_run: bool,
    actor: str,
    reason: str,
) -> Resend:
    """Send again the delivered and dead effects ``flt`` matches (``flt.state`` may
    narrow it to one of them), refusing (409) more than ``cap``; counted first."""
    reason = check_reason(reason)
    check_cap(cap)
    if flt.state is not None and flt.state not in RESENDABLE:
        raise InvalidRequest(
            "state", f"a {flt.state} effect is not resent", "use delivered or dead"
        )
    if flt.key_prefix is not None:
        raise InvalidRequest("key_prefix", "is not a bulk filter", "resend the key itself")
    params = _filter_params(flt) | {"cap_plus_one": cap + 1}
    found = conn.execute(_Q["count_resendable"], params).one()
    refused = {why: n for why, n in conn.execute(_Q["count_refused"], params)}
    target = _describe(flt)
    if dry_run:
        return Resend(target, found.n, 0, found.paused, refused, True, cap, None)
    rows = conn.execute(_Q["lock_resendable"], params).all()
    if len(rows) > cap:
        raise Conflict(
            f"more than {cap} effects match; narrow the filter or raise cap (at most "
            f"{MAX_BULK_CAP}); nothing was resent"
        )
    keys = [r.idempotency_key for r in rows]
    shown = {k: v for k, v in params.items() if k in _FILTER and v is not None}
    details = {"filter": shown, "resent": len(keys), "keys": keys[:100]}
    action_id = record_action(
        conn, actor=actor, action="bulk_resend", target=target, reason=reason, details=details
    )
    _apply(conn, [r.id for r in rows], action_id)
    return Resend(target, len(keys), len(keys), found.paused, refused, False, cap, action_id)


def _apply(conn: Connection, ids: list[int], action_id: int) -> None:
    if not ids:
        return
    done = conn.execute(_Q["resend_ids"], {"ids": ids, "action_id": action_id}).all()
    if len(done) != len(ids):  # cannot happen: the rows are locked, delivered or dead
        raise Conflict("an effect changed while being resent; try again")
    wakeup.notify(conn, "resent")


def _check_one(key: str, row: Any) -> None:
    state = row["state"]
    if state not in RESENDABLE:
        raise Conflict(
            f"effect {key} is {state}; only a delivered or dead effect is resent: "
            f"{_NOT_NOW.get(state, 'its state does not allow it')}"
        )
    if row["purged_at"] is not None:
        if (row["last_error"] or "").startswith(ERASED_PREFIX):
            raise Conflict(
                f"effect {key} was {row['last_error']}: its payload is gone and stays gone; "
                "an erased effect is never sent again"
            )
        raise Conflict(
            f"effect {key} was purged by retention at {row['purged_at'].isoformat()}: its "
            "payload is gone, so there is nothing to send; produce it again as a revision "
            "(a new key) if it must go out"
        )
    if row["send_by_passed"] is not None:
        raise Conflict(
            f"effect {key}'s send-by time {iso(row['send_by_passed'])} has passed: sent again "
            "it would only expire, so it is not resent"
            + (
                "; requeue it with a new send-by time (outbox effects requeue KEY --expires-at "
                "...) if it is still worth sending"
                if row["state"] == "dead"
                else ""
            )
        )
    if row["archived_at"] is not None:
        name = row["endpoint"]
        raise Conflict(f"endpoint {name!r} is archived; {unarchive_hint(name)}, then resend")
    if not row["registered"]:
        raise Conflict(f"endpoint {row['endpoint']!r} is not registered; register it first")


def _unknown(conn: Connection, key: str) -> NotFound:
    ledger = conn.execute(_Q["ledger_entry"], {"key": key}).mappings().first()
    if ledger is None:
        return NotFound(f"no effect with key {key!r}")
    return NotFound(
        f"effect {key} finished {ledger['state']} on {ledger['endpoint']} at "
        f"{ledger['finished_at'].isoformat()}, and its record is gone: nothing to resend"
    )


def _filter_params(flt: EffectFilter) -> dict[str, Any]:
    params = flt.params()
    return {name: params[name] for name in _FILTER} | {
        "erased_note": ERASED_PREFIX,
        "scan_limit": MAX_BULK_CAP + 1,
    }


def _describe(flt: EffectFilter) -> str:
    parts = [f"{k}={v}" for k, v in dataclasses.asdict(flt).items() if v is not None]
    return " ".join(parts)
