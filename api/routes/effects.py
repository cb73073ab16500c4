"""The delivery audit: one effect with its timeline, the search, the CSV export."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from api.deps import Conn, EngineDep, Reader, SettingsDep
from api.params import PAGE_LIMIT, Filter, Key
from api.responses import LOOKUP_ERRORS, READ_ERRORS
from api.schemas import EffectDetailPublic, EffectPagePublic
from dispatcher import audit
from dispatcher.filters import EffectFilter

router = APIRouter(tags=["read"])

CSV_COLUMNS = (
    "idempotency_key",
    "job",
    "batch_id",
    "endpoint",
    "recipient",
    "reference",
    "state",
    "attempt_count",
    "created_at",
    "delivered_at",
    "next_attempt_at",
    "last_error",
    "purged_at",
)


@router.get("/v1/effects", response_model=EffectPagePublic, responses=READ_ERRORS)
def search_effects(
    conn: Conn,
    _: Reader,
    flt: Filter,
    limit: Annotated[int, PAGE_LIMIT] = 100,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor")] = None,
) -> EffectPagePublic:
    """A keyset page, newest first. since/until are required (at most 31 days apart)."""
    return EffectPagePublic.model_validate(audit.search(conn, flt, limit=limit, cursor=cursor))


@router.get(
    "/v1/effects.csv",
    response_class=StreamingResponse,
    responses={**READ_ERRORS, 200: {"content": {"text/csv": {}}}},
)
def export_effects(engine: EngineDep, _: Reader, flt: Filter) -> StreamingResponse:
    """The search's matches as CSV, streamed (no payloads: they may be sensitive)."""
    return StreamingResponse(
        _csv_lines(engine, flt),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="effects.csv"'},
    )


def _cell(value: object) -> object:
    """Neutralise spreadsheet formulas: a receiver's error text or a recipient that
    starts with = + - @ would run as a formula in the support person's spreadsheet."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _csv_lines(engine: EngineDep, flt: EffectFilter) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for n, effect in enumerate(audit.export(engine, flt), start=1):
        writer.writerow([_cell(getattr(effect, c)) for c in CSV_COLUMNS])
        if n % 500 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


@router.get("/v1/effects/{key}", response_model=EffectDetailPublic, responses=LOOKUP_ERRORS)
def effect_detail(conn: Conn, token: Reader, settings: SettingsDep, key: Key) -> EffectDetailPublic:
    """The effect, its attempts as a timeline, and the batch marker that produced it.

    Payload fields listed in OUTBOX_SENSITIVE_FIELDS are masked for the support role.
    """
    detail = EffectDetailPublic.model_validate(audit.effect_detail(conn, key))
    if not token.is_operator and settings.sensitive_fields:
        payload = audit.mask_payload(detail.effect.payload, settings.sensitive_fields)
        detail.effect.payload = payload
    return detail
