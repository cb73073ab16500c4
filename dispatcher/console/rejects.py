"""Rejects: the rows a batch refused, with their reasons, page by page; and the
one kind a fix outside the data cures, enqueued again (``requeue``).

A reject's ``raw_row`` is the row as the job produced it (an effect row, or a
business event the job could not use), so it may hold personal data: for the
support role it is masked with the payload rules (``OUTBOX_SENSITIVE_FIELDS``),
at the top level and inside an effect row's ``payload``. A payload that is not
a JSON object (often the very reason for the reject) cannot be searched for
those fields and is hidden whole. The reason is masked as outside text is
(``masking``, rule 2): a job writes its own, and the sink's may quote a value.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console.audit import from_row
from spark_outbox.console.filters import MAX_BIGINT, InvalidFilter, check_limit
from spark_outbox.console.operations import MAX_BULK_CAP, check_cap
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import Conflict, InvalidEffect, UnknownEndpoint
from spark_outbox.core.masking import MASK, mask_payload, mask_text, masked_values
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "rejects.sql")
_CURSOR_PREFIX = "reject:"


@dataclasses.dataclass(frozen=True)
class Reject:
    id: int
    job: str
    batch_id: str
    run_id: uuid.UUID | None
    reason: str
    raw_row: dict[str, Any]
    rejected_at: dt.datetime
    requeued_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class RejectPage:
    items: list[Reject]
    next_cursor: str | None


@dataclasses.dataclass(frozen=True)
class RequeuedRejects:
    """What ``requeue`` did (or, on a dry run, would do) with a batch's rejects."""

    job: str
    batch_id: str
    matched: int  # unknown-endpoint rejects not requeued before (counted up to cap + 1)
    enqueued: int  # became new effects
    known: int  # their key was already known (an effect exists): nothing new
    still_refused: dict[str, int]  # reason -> rows, for rows that fail the checks again
    dry_run: bool
    cap: int

    @property
    def over_cap(self) -> bool:
        """More match than ``cap``: nothing was done, and ``matched`` is cap + 1."""
        return self.matched > self.cap


def _encode(reject_id: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{reject_id}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> int:
    """The reject id, or ``InvalidFilter`` (a 422): an id beyond bigint would reach the
    database and fail there (a 500)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith(_CURSOR_PREFIX):
            raise ValueError(raw)
        reject_id = int(raw.removeprefix(_CURSOR_PREFIX))
        if not 0 < reject_id <= MAX_BIGINT:
            raise ValueError("id out of range")
        return reject_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidFilter(
            "cursor", "is not a cursor this API issued", "pass next_cursor unchanged"
        ) from exc


def of_batch(
    conn: Connection, job: str, batch_id: str, *, limit: int = 100, cursor: str | None = None
) -> RejectPage:
    """One page of the batch's rejects, newest first; ``next_cursor`` None on the last."""
    limit = check_limit(limit)
    params = {
        "job": job,
        "batch_id": batch_id,
        "before_id": _decode(cursor) if cursor else None,
        "limit": limit + 1,
    }
    items = [from_row(Reject, r) for r in conn.execute(_Q["rejects_of_batch"], params).mappings()]
    if len(items) <= limit:
        return RejectPage(items=items, next_cursor=None)
    items = items[:limit]
    return RejectPage(items=items, next_cursor=_encode(items[-1].id))


def masked(reject: Reject, paths: Sequence[str]) -> Reject:
    """The reject with its raw row masked by ``paths``, and its reason (the job's own,
    or the sink's, which may quote a value) masked like outside text with the values
    those paths hold in the row (nothing to mask: unchanged)."""
    if not paths:
        return reject
    reason = mask_text(reject.reason, paths, _sensitive_values(reject.raw_row, paths))
    row = mask_payload(reject.raw_row, paths)
    if "payload" in row:
        row["payload"] = _masked_payload(row["payload"], paths)
    return dataclasses.replace(reject, reason=reason or reject.reason, raw_row=row)


def _sensitive_values(row: dict[str, Any], paths: Sequence[str]) -> list[str]:
    """What ``paths`` hold in the row, at its top level and in its payload (an object,
    or a JSON object as text; a payload that does not parse yields nothing)."""
    payload = row.get("payload")
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            payload = None
    values = set(masked_values(row, paths))
    if isinstance(payload, dict):
        values.update(masked_values(payload, paths))
    return sorted(values, key=len, reverse=True)


def _masked_payload(payload: Any, paths: Sequence[str]) -> Any:
    if isinstance(payload, dict):
        return mask_payload(payload, paths)
    if isinstance(payload, str):
        try:
            parsed = json.loads(payload)
        except ValueError:
            return MASK
        if isinstance(parsed, dict):
            return json.dumps(mask_payload(parsed, paths), ensure_ascii=False)
    return MASK if payload is not None else None


def requeue(
    conn: Connection,
    job: str,
    batch_id: str,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    cap: int = MAX_BULK_CAP,
) -> RequeuedRejects:
    """Enqueue again the effects a batch rejected for naming an unregistered endpoint.

    Only that reject is requeued: registering the endpoint is a fix outside the
    data, while every other reason (a bad payload, a job's own ``reject_reason``)
    is about the row itself and stays a reject. Each row passes the checks of
    ``enqueue`` again (same key, so a requeue never duplicates an effect); rows
    that still fail (the endpoint is still missing, or another rule now refuses
    them) stay rejects and are counted by reason. A dry run does everything in a
    savepoint and rolls it back: its counts are exact, and nothing is written.

    The batch's hold (the volume guard) binds its requeued rows too: from a held
    batch they wait with it (sent on release, cancelled on cancel); a cancelled
    batch's rejects are refused (``Conflict``), as nothing of it is delivered.
    """
    reason = check_reason(reason)
    check_cap(cap)
    hold = conn.execute(_Q["lock_batch_hold"], {"job": job, "batch_id": batch_id}).first()
    if hold is not None and hold.hold_state == "cancelled":
        raise Conflict(
            f"batch {batch_id!r} of job {job!r} was cancelled: nothing of it is delivered, "
            "so its rejects are not requeued; enqueue the rows again as a new batch"
        )
    params = {"job": job, "batch_id": batch_id, "prefix": UnknownEndpoint.PREFIX}
    rows = conn.execute(_Q["requeueable_rejects"], params | {"limit": cap + 1}).all()
    done = RequeuedRejects(job, batch_id, len(rows), 0, 0, {}, dry_run, cap)
    if len(rows) > cap:
        return done  # the caller says "more than cap": nothing is changed
    trial = conn.begin_nested()
    try:
        enqueued, known, refused, cured, new_keys = _enqueue_rows(conn, rows)
        if cured:
            conn.execute(_Q["mark_requeued"], {"ids": cured})
        if new_keys and hold is not None and hold.hold_state == "held":
            conn.execute(
                _Q["wait_with_held_batch"],
                {"job": job, "batch_id": batch_id, "run_id": hold.run_id, "keys": new_keys},
            )
    finally:
        if dry_run:
            trial.rollback()
        else:
            trial.commit()
    done = dataclasses.replace(done, enqueued=enqueued, known=known, still_refused=refused)
    if not dry_run and cured:
        record_action(
            conn,
            actor=actor,
            action="requeue_rejects",
            target=f"{job}/{batch_id}",
            reason=reason,
            details={"enqueued": enqueued, "known": known, "still_refused": sum(refused.values())},
        )
    return done


def _enqueue_rows(
    conn: Connection, rows: Sequence[Any]
) -> tuple[int, int, dict[str, int], list[int], list[str]]:
    """(new, known, refused reasons, ids of the rejects that are effects now, keys of
    the new effects)."""
    enqueued = known = 0
    refused: dict[str, int] = {}
    cured: list[int] = []
    new_keys: list[str] = []
    for row in rows:
        raw = row.raw_row if isinstance(row.raw_row, dict) else {}
        try:
            with conn.begin_nested():
                done = enqueue(
                    conn,
                    idempotency_key=raw.get("idempotency_key") or "",
                    endpoint=raw.get("endpoint") or "",
                    payload=raw.get("payload") or "",
                    recipient=raw.get("recipient"),
                    ordering_key=raw.get("ordering_key"),
                    not_before=_instant(raw.get("not_before")),
                    reference=raw.get("reference"),
                    supersedes=raw.get("supersedes"),
                    expires_at=_instant(raw.get("expires_at")),
                )
        except InvalidEffect as exc:
            refused[str(exc)] = refused.get(str(exc), 0) + 1
            continue
        cured.append(row.id)
        if done.new:
            enqueued += 1
            new_keys.append(done.idempotency_key)
        else:
            known += 1
    return enqueued, known, refused, cured, new_keys


def _instant(value: Any) -> Any:
    """A reject's ``not_before`` or ``expires_at`` is text (the row as JSON): back to an
    aware datetime when it reads as one; anything else goes to the check unchanged and
    is refused there."""
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return value
        return parsed if parsed.tzinfo is not None else value
    return value
