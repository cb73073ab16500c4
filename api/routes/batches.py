"""Committed batches: the marker's counts beside what the batch's effects do now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import Conn, Reader
from api.params import NO_NUL, PAGE_LIMIT, Name
from api.responses import LOOKUP_ERRORS, READ_ERRORS
from api.schemas import BatchDetailPublic, BatchPublic
from dispatcher import audit

router = APIRouter(tags=["read"])


@router.get("/v1/batches", response_model=list[BatchPublic], responses=READ_ERRORS)
def batches_of_job(
    conn: Conn,
    _: Reader,
    job: Annotated[str, Query(min_length=1, max_length=200, pattern=NO_NUL)],
    limit: Annotated[int, PAGE_LIMIT] = 100,
) -> list[BatchPublic]:
    """A job's committed batches, newest first, with the counts recorded at commit."""
    return [BatchPublic.model_validate(b) for b in audit.batches_of_job(conn, job, limit=limit)]


@router.get(
    "/v1/batches/{job}/{batch_id}", response_model=BatchDetailPublic, responses=LOOKUP_ERRORS
)
def batch_detail(conn: Conn, _: Reader, job: Name, batch_id: Name) -> BatchDetailPublic:
    """The marker's counts and the live ones (pending … cancelled, rejects)."""
    return BatchDetailPublic.model_validate(audit.batch_detail(conn, job, batch_id))
