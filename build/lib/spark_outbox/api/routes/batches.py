"""Committed batches: the marker's counts beside what the batch's effects do now, and
their reconciliation.

Batch ids may hold any character (a streaming id holds '/', others '%', '?', '#',
spaces, line breaks, unicode): the path form takes the rest of the path
(``{batch_id:anypath}``, percent-encoded by the client), and the query forms
(``/v1/batch``, ``/v1/reconcile``) take any id at all, dot segments such as
``..`` included (clients normalise those away in a path).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.convertors import Convertor, register_url_convertor

from spark_outbox.api.deps import Conn, Reader
from spark_outbox.api.params import NO_NUL, PAGE_LIMIT, Name
from spark_outbox.api.responses import LOOKUP_ERRORS, READ_ERRORS
from spark_outbox.api.schemas import BatchDetailPublic, BatchPublic, ReconciliationPublic
from spark_outbox.console import audit, reconcile


class AnyPath(Convertor[str]):
    """Starlette's ``path`` without its one gap: ``.`` there does not match a line break."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anypath", AnyPath())
router = APIRouter(tags=["read"])

Job = Annotated[str, Query(min_length=1, max_length=200, pattern=NO_NUL)]
BatchIdQuery = Annotated[
    str, Query(min_length=1, max_length=1000, pattern=NO_NUL, description="any batch id")
]
BatchIdPath = Annotated[
    str,
    Path(min_length=1, max_length=1000, pattern=NO_NUL, description="percent-encoded batch id"),
]


@router.get("/v1/batches", response_model=list[BatchPublic], responses=READ_ERRORS)
def batches_of_job(
    conn: Conn, _: Reader, job: Job, limit: Annotated[int, PAGE_LIMIT] = 100
) -> list[BatchPublic]:
    """A job's committed batches, newest first, with the counts recorded at commit."""
    return [BatchPublic.model_validate(b) for b in audit.batches_of_job(conn, job, limit=limit)]


@router.get(
    "/v1/batches/{job}/{batch_id:anypath}",
    response_model=BatchDetailPublic,
    responses=LOOKUP_ERRORS,
)
def batch_detail(conn: Conn, _: Reader, job: Name, batch_id: BatchIdPath) -> BatchDetailPublic:
    """The marker's counts and the live ones (pending … cancelled, rejects)."""
    return BatchDetailPublic.model_validate(audit.batch_detail(conn, job, batch_id))


@router.get("/v1/batch", response_model=BatchDetailPublic, responses=LOOKUP_ERRORS)
def batch_by_query(conn: Conn, _: Reader, job: Job, batch_id: BatchIdQuery) -> BatchDetailPublic:
    """The same as ``/v1/batches/{job}/{batch_id}``, for any batch id whatsoever."""
    return BatchDetailPublic.model_validate(audit.batch_detail(conn, job, batch_id))


@router.get("/v1/reconcile", response_model=list[ReconciliationPublic], responses=LOOKUP_ERRORS)
def reconcile_batches(
    conn: Conn,
    _: Reader,
    job: Job,
    batch_id: Annotated[
        str | None, Query(max_length=1000, pattern=NO_NUL, description="one batch")
    ] = None,
    limit: Annotated[int, PAGE_LIMIT] = 100,
) -> list[ReconciliationPublic]:
    """Per batch: result rows <-> effects <-> deliveries, every difference in a category;
    ``unexplained`` > 0 means something does not add up (the job's newest batches)."""
    found = (
        [reconcile.batch(conn, job, batch_id)]
        if batch_id is not None
        else reconcile.job(conn, job, limit=limit)
    )
    return [ReconciliationPublic.model_validate(reconcile.as_dict(r)) for r in found]
