"""The delivery audit: one effect with its timeline, the search, the CSV export."""

from __future__ import annotations

import csv
import datetime as dt
import io
import unicodedata
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from spark_outbox.api.deps import Conn, EngineDep, Reader, SettingsDep, masked_for
from spark_outbox.api.params import PAGE_LIMIT, Filter, Key
from spark_outbox.api.responses import LOOKUP_ERRORS, READ_ERRORS
from spark_outbox.api.schemas import EffectDetailPublic, EffectPagePublic
from spark_outbox.console import audit
from spark_outbox.console.filters import EffectFilter
from spark_outbox.core.timestamps import iso

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
    token: Reader,
    settings: SettingsDep,
    flt: Filter,
    limit: Annotated[int, PAGE_LIMIT] = 100,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor")] = None,
) -> EffectPagePublic:
    """A keyset page, newest first. A narrow search (a batch: job and batch_id; a
    recipient; a reference; a key prefix; the state pending, leased, dead or uncertain)
    finds effects at any age; a broad one (an endpoint, a job, delivered, cancelled)
    needs since/until, at most 31 days apart.

    For the support role, last_error is masked as in the effect's detail."""
    mask = masked_for(token, settings)
    return EffectPagePublic.model_validate(
        audit.search(conn, flt, limit=limit, cursor=cursor, mask=mask)
    )


@router.get(
    "/v1/effects.csv",
    response_class=StreamingResponse,
    responses={**READ_ERRORS, 200: {"content": {"text/csv": {}}}},
)
def export_effects(
    engine: EngineDep, token: Reader, settings: SettingsDep, flt: Filter
) -> StreamingResponse:
    """The search's matches as CSV, streamed (no payloads: they may be sensitive; for the
    support role, last_error is masked as in the effect's detail)."""
    return StreamingResponse(
        _csv_lines(engine, flt, masked_for(token, settings)),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="effects.csv"'},
    )


_FORMULA_STARTS = ("=", "+", "-", "@")


def spreadsheet_safe(value: object) -> object:
    """Neutralise spreadsheet formulas: a receiver's error text or a recipient that
    starts with = + - @ would run as a formula in the support person's spreadsheet.

    Spreadsheets skip leading whitespace and read full-width and other compatibility
    forms (＝ ＋ － ＠, ﹦, ⁼ ...) as the ASCII sign, so the test looks past leading
    whitespace and control or format characters and at the NFKC form of the first
    character after them. A cell that starts with a tab or CR is neutralised too.
    Neutralised cells get a leading ``'``: the spreadsheet shows them as text.
    Instants are written as in the JSON (``iso``).
    """
    if isinstance(value, dt.datetime):
        return iso(value)
    if not isinstance(value, str) or not value:
        return value
    if value[0] in ("\t", "\r"):
        return "'" + value
    for char in value:
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf"):
            continue
        if unicodedata.normalize("NFKC", char).startswith(_FORMULA_STARTS):
            return "'" + value
        break
    return value


def _csv_lines(engine: EngineDep, flt: EffectFilter, mask: tuple[str, ...]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for n, effect in enumerate(audit.export(engine, flt, mask=mask), start=1):
        writer.writerow([spreadsheet_safe(getattr(effect, c)) for c in CSV_COLUMNS])
        if n % 500 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


@router.get("/v1/effects/{key}", response_model=EffectDetailPublic, responses=LOOKUP_ERRORS)
def effect_detail(conn: Conn, token: Reader, settings: SettingsDep, key: Key) -> EffectDetailPublic:
    """The effect, its attempts as a timeline, and the batch marker that produced it.

    For the support role, the payload fields listed in OUTBOX_SENSITIVE_FIELDS are
    masked, and so are their values wherever a receiver's text repeats them
    (response excerpts, errors): docs/api.md has the rule.
    """
    detail = audit.effect_detail(conn, key, mask=masked_for(token, settings))
    return EffectDetailPublic.model_validate(detail)
