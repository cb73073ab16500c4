"""Query parameters shared by the search, its CSV export and the support page."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import Depends, Path, Query

from spark_outbox.console.filters import MAX_PAGE, MAX_RANGE_DAYS, EffectFilter, build_filter
from spark_outbox.core.validation import MAX_REFERENCE_CHARS

# PostgreSQL text cannot hold NUL; refuse it at the edge (422), not in the driver (500).
NO_NUL = r"^[^\x00]*$"
KEY_PATTERN = r"^[0-9a-f]{64}$"

Key = Annotated[str, Path(pattern=KEY_PATTERN, description="the effect's idempotency key")]
PAGE_LIMIT = Query(ge=1, le=MAX_PAGE, description=f"page size, at most {MAX_PAGE}")
Name = Annotated[str, Path(min_length=1, max_length=200, pattern=NO_NUL)]


def _text(max_length: int, description: str) -> object:
    return Query(max_length=max_length, pattern=NO_NUL, description=description)


def effect_filter(
    since: Annotated[
        dt.datetime | None,
        Query(
            description=f"ISO 8601 with zone; required for a broad search (≤ {MAX_RANGE_DAYS} d), "
            "optional for a narrow one: a batch, a recipient, a reference, a key prefix, or the "
            "state pending, leased, dead or uncertain"
        ),
    ] = None,
    until: Annotated[dt.datetime | None, Query(description="with since; exclusive")] = None,
    job: Annotated[str | None, _text(200, "job name")] = None,
    batch_id: Annotated[str | None, _text(200, "batch id (needs job)")] = None,
    endpoint: Annotated[str | None, _text(200, "endpoint name")] = None,
    recipient: Annotated[str | None, _text(320, "recipient, exact")] = None,
    reference: Annotated[
        str | None, _text(MAX_REFERENCE_CHARS, "business reference (an invoice number), exact")
    ] = None,
    state: Annotated[
        str | None,
        Query(description="pending, leased, delivered, dead, cancelled, uncertain or expired"),
    ] = None,
    key_prefix: Annotated[
        str | None,
        _text(80, "the start of a key as reports print it: 8+ hex characters, e.g. 13dd1f9d44fa…"),
    ] = None,
) -> EffectFilter:
    """The filter, checked: a broad search without its time range, or over 31 days, is a
    422 naming the fix."""
    return build_filter(
        since=since,
        until=until,
        job=job,
        batch_id=batch_id,
        endpoint=endpoint,
        recipient=recipient,
        reference=reference,
        state=state,
        key_prefix=key_prefix,
    )


Filter = Annotated[EffectFilter, Depends(effect_filter)]
