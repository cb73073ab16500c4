"""The effect search filter shared by the audit search, its CSV export and the bulk actions.

A search must name at least one indexed column (job, endpoint, recipient,
reference, state or a key prefix), so every query it produces is an index range
scan. A **narrow** search finds the same few effects at any age and needs no
time window: one batch (``job`` + ``batch_id``: what one commit wrote), a
recipient, a business reference, a key prefix, or a state that is work rather
than history (pending, leased, dead, uncertain: effects leave them, or an
operator must look). A **broad** one (an endpoint, a job, the delivered or
cancelled state) is bounded in time: ``since`` .. ``until``, at most
``MAX_RANGE_DAYS``. A window may narrow a narrow search too, of any width.
Pages are keyset pages on ``(created_at, id)``; the cursor is opaque.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
from typing import Any

from spark_outbox.core import timestamps
from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.schema import EFFECT_STATES

MAX_RANGE_DAYS = 31
MAX_PAGE = 500
MAX_BIGINT = 2**63 - 1  # a row id beyond it the database refuses (an error, not a miss)
# States an effect leaves, or that wait for an operator: few at any age, so a
# search by them needs no window (delivered and cancelled are history: broad).
WORK_STATES = ("pending", "leased", "dead", "uncertain")
# A key as reports print it (``13dd1f9d44fa…``): at least 8 of its hex characters,
# a trailing ellipsis (or three dots) dropped.
MIN_KEY_PREFIX = 8
_KEY_PREFIX = re.compile(rf"^[0-9a-f]{{{MIN_KEY_PREFIX},64}}$")


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
    key_prefix: str | None = None  # lower-case hex, MIN_KEY_PREFIX to 64 characters

    def params(self) -> dict[str, Any]:
        """Bind parameters for the named filter SQL (absent filters are NULL).

        A key prefix is a range of the unique key index, ``key_prefix`` <= key <
        ``key_prefix_end``: under any collation, keys of hex characters with that
        prefix sort there and no other key does ('g' sorts after every hex digit),
        so the range holds where ``LIKE 'p%'`` could not use the index (a database
        whose collation is not C)."""
        end = None if self.key_prefix is None else self.key_prefix + "g"
        return dataclasses.asdict(self) | {"key_prefix_end": end}


def _aware(field: str, value: dt.datetime | None) -> dt.datetime:
    if value is None:
        raise InvalidFilter(
            field,
            "is required",
            f"give since and until (ISO 8601 with a zone, at most {MAX_RANGE_DAYS} days apart), "
            "e.g. since=2026-11-01T00:00:00Z&until=2026-11-22T00:00:00Z, or search by something "
            "narrow (a batch: job and batch_id; a recipient; a reference; a key prefix; the state "
            f"{', '.join(WORK_STATES)}), which needs no window",
        )
    if value.tzinfo is None:
        raise InvalidFilter(field, "has no time zone", "append Z or an offset like +01:00")
    # In UTC: PostgreSQL refuses offsets beyond 15:59 and seconds in one that ISO allows.
    return timestamps.utc(field, value)


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
    key_prefix: str | None = None,
) -> EffectFilter:
    """Check a search's bounds; raise ``InvalidFilter`` naming the field and the fix."""
    state, key_prefix = _state(state), _key_prefix(key_prefix)
    if batch_id is not None and job is None:
        raise InvalidFilter("batch_id", "needs job", "give job too (a batch id is per job)")
    if not any((job, endpoint, recipient, state, reference, key_prefix)):
        raise InvalidFilter(
            "job",
            "no indexed filter given",
            "filter by at least one of job, endpoint, recipient, reference, state or key_prefix",
        )
    narrow = bool(
        (job and batch_id) or recipient or reference or key_prefix or state in WORK_STATES
    )
    flt = EffectFilter(None, None, job, batch_id, endpoint, recipient, state, reference, key_prefix)
    if narrow and since is None and until is None:
        return flt
    since, until = _aware("since", since), _aware("until", until)
    if until <= since:
        raise InvalidFilter("until", "is not after since", "give until later than since")
    if not narrow and until - since > dt.timedelta(days=MAX_RANGE_DAYS):
        raise InvalidFilter(
            "until",
            f"the range since..until is wider than {MAX_RANGE_DAYS} days",
            f"narrow it to at most {MAX_RANGE_DAYS} days and page through the rest",
        )
    return dataclasses.replace(flt, since=since, until=until)


def _key_prefix(raw: str | None) -> str | None:
    """A key or the start of one, as printed (``13dd1f9d44fa…``): lower-cased, the
    ellipsis dropped; ``InvalidFilter`` unless MIN_KEY_PREFIX to 64 hex characters."""
    if raw is None:
        return None
    text = raw.strip().removesuffix("…").removesuffix("...").strip().lower()
    if not _KEY_PREFIX.match(text):
        raise InvalidFilter(
            "key_prefix",
            f"{raw[:80]!r} is not the start of a key",
            f"give at least {MIN_KEY_PREFIX} of the key's hex characters, as printed "
            "(e.g. 13dd1f9d44fa…)",
        )
    return text


def _state(state: str | None) -> str | None:
    if state is not None and state not in EFFECT_STATES:
        raise InvalidFilter("state", f"{state!r} is not a state", f"use one of {EFFECT_STATES}")
    return state


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidFilter("limit", f"{limit} is out of range", f"use 1 to {MAX_PAGE}")
    return limit
