"""A batch's rejects: the rows the sink refused, with the reason naming the field and the fix."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Query

from spark_outbox.api.deps import Conn, Reader, SettingsDep
from spark_outbox.api.params import NO_NUL, PAGE_LIMIT
from spark_outbox.api.responses import READ_ERRORS
from spark_outbox.api.schemas import RejectPagePublic
from spark_outbox.console import rejects

router = APIRouter(tags=["read"])


@router.get("/v1/rejects", response_model=RejectPagePublic, responses=READ_ERRORS)
def rejects_of_batch(
    conn: Conn,
    token: Reader,
    settings: SettingsDep,
    job: Annotated[str, Query(min_length=1, max_length=200, pattern=NO_NUL)],
    batch_id: Annotated[
        str, Query(min_length=1, max_length=200, pattern=NO_NUL, description="see /v1/batches")
    ],
    limit: Annotated[int, PAGE_LIMIT] = 100,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor")] = None,
) -> RejectPagePublic:
    """A keyset page of one batch's rejects, newest first (no time window: a batch is
    bounded). Raw rows are masked for the support role like payloads."""
    page = rejects.of_batch(conn, job, batch_id, limit=limit, cursor=cursor)
    mask = () if token.is_operator else settings.sensitive_fields
    items = [rejects.masked(r, mask) for r in page.items]
    return RejectPagePublic.model_validate(dataclasses.replace(page, items=items))
