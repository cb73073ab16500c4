"""The effect search filter shared by the audit search, its CSV export and bulk requeue.

A search must name at least one indexed column (job, endpoint, recipient,
reference or state), so every query it produces is an index range scan, and be
bounded: by a batch (``job`` + ``batch_id``: a batch holds what one commit
wrote), or in time (``since`` .. ``until``, at most ``MAX_RANGE_DAYS``) for the
open-ended searches.
Pages are keyset pages on ``(created_at, id)``; the cursor is opaque.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
from typing import Any

from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.schema import EFFECT_STATES

MAX_RANGE_DAYS = 31
MAX_PAGE = 500
MAX_BIGINT = 2**63 - 1  # a row id beyond it the database refuses (an error, not a miss)


class InvalidFilter(InvalidRequest):
    """A search filter is missing or out of bounds; names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Cursor:
    created_at: dt.datetime
    id: int

    def encode(self) -> str:
        raw = f"{self.created_at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor, or ``InvalidFilter`` (a 422): whatever a client sends, nothing
        reaches the database that it would refuse (a naive or out-of-range time, an id
        beyond bigint)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            at, ident = raw.split("|")
            created_at = dt.datetime.fromisoformat(at)
            if created_at.tzinfo is None:
                raise ValueError("naive")
            row_id = int(ident)
            if not 0 < row_id <= MAX_BIGINT:
                raise ValueError("id out of range")
            # UTC: an offset with seconds would not survive the trip to PostgreSQL.
            return cls(created_at=created_at.astimezone(dt.UTC), id=row_id)
        except (ValueError, UnicodeDecodeError, OverflowError) as exc:
            raise InvalidFilter(
                "cursor", "is not a cursor this API issued", "pass next_cursor unchanged"
            ) from exc


@dataclasses.dataclass(frozen=True)
class EffectFilter:
    # None for both when the search is bounded by a batch (job + batch_id).
    since: dt.datetime | None
    until: dt.datetime | None
    job: str | None = None
    batch_id: str | None = None
    endpoint: str | None = None
    recipient: str | None = None
    state: str | None = None
    reference: str | None = None

    def params(self) -> dict[str, Any]:
        """Bind parameters for the named filter SQL (absent filters are NULL)."""
        return dataclasses.asdict(self)


def _aware(field: str, value: dt.datetime | None) -> dt.datetime:
    if value is None:
        raise InvalidFilter(
            field,
            "is required",
            f"give since and until (ISO 8601 with a zone, at most {MAX_RANGE_DAYS} days apart), "
            "e.g. since=2026-11-01T00:00:00Z&until=2026-11-22T00:00:00Z, or search one batch "
            "(job and batch_id), which needs no window",
        )
    if value.tzinfo is None:
        raise InvalidFilter(field, "has no time zone", "append Z or an offset like +01:00")
    return value


def build_filter(
    *,
    since: dt.datetime | None,
    until: dt.datetime | None,
    job: str | None = None,
    batch_id: str | None = None,
    endpoint: str | None = None,
    recipient: str | None = None,
    state: str | None = None,
    reference: str | None = None,
) -> EffectFilter:
    """Check a search's bounds; raise ``InvalidFilter`` naming the field and the fix."""
    if job is not None and batch_id is not None and since is None and until is None:
        return EffectFilter(None, None, job, batch_id, endpoint, recipient, _state(state))
    since, until = _aware("since", since), _aware("until", until)
    if until <= since:
        raise InvalidFilter("until", "is not after since", "give until later than since")
    if until - since > dt.timedelta(days=MAX_RANGE_DAYS):
        raise InvalidFilter(
            "until",
            f"the range since..until is wider than {MAX_RANGE_DAYS} days",
            f"narrow it to at most {MAX_RANGE_DAYS} days and page through the rest",
        )
    state = _state(state)
    if batch_id is not None and job is None:
        raise InvalidFilter("batch_id", "needs job", "give job too (a batch id is per job)")
    if not any((job, endpoint, recipient, state, reference)):
        raise InvalidFilter(
            "job",
            "no indexed filter given",
            "filter by at least one of job, endpoint, recipient, reference or state",
        )
    return EffectFilter(since, until, job, batch_id, endpoint, recipient, state, reference)


def _state(state: str | None) -> str | None:
    if state is not None and state not in EFFECT_STATES:
        raise InvalidFilter("state", f"{state!r} is not a state", f"use one of {EFFECT_STATES}")
    return state


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidFilter("limit", f"{limit} is out of range", f"use 1 to {MAX_PAGE}")
    return limit
