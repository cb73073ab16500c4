"""Rejects, read side: the rows a batch refused, with their reasons, page by page.

A reject's ``raw_row`` is the row as the job produced it (an effect row, or a
business event the job could not use), so it may hold personal data: for the
support role it is masked with the payload rules (``OUTBOX_SENSITIVE_FIELDS``),
at the top level and inside an effect row's ``payload``. A payload that is not
a JSON object (often the very reason for the reject) cannot be searched for
those fields and is hidden whole.
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

from dispatcher.audit import from_row
from dispatcher.filters import InvalidFilter, check_limit
from dispatcher.masking import MASK, mask_payload
from dispatcher.sqlfile import queries_beside

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


@dataclasses.dataclass(frozen=True)
class RejectPage:
    items: list[Reject]
    next_cursor: str | None


def _encode(reject_id: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{reject_id}".encode()).decode().rstrip("=")


def _decode(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith(_CURSOR_PREFIX):
            raise ValueError(raw)
        return int(raw.removeprefix(_CURSOR_PREFIX))
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
    """The reject with its raw row masked by ``paths`` (nothing to mask: unchanged)."""
    if not paths:
        return reject
    row = mask_payload(reject.raw_row, paths)
    if "payload" in row:
        row["payload"] = _masked_payload(row["payload"], paths)
    return dataclasses.replace(reject, raw_row=row)


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
