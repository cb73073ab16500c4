"""Health, readiness and the status overview."""

from __future__ import annotations

import functools

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from spark_outbox.api.deps import Conn, EngineDep, Reader
from spark_outbox.api.responses import READ_ERRORS
from spark_outbox.api.schemas import StatusPublic
from spark_outbox.console import health
from spark_outbox.core import db

router = APIRouter()

# The head is a property of the installed code, not of the database: read it once.
_head_revision = functools.cache(db.head_revision)


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    """The process is up (no database call: liveness, not readiness)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
def readyz(engine: EngineDep) -> JSONResponse:
    """Ready when PostgreSQL answers and the schema is at the migrations' head."""
    head = _head_revision()
    try:
        current = db.current_revision(engine)
    except Exception:  # any failure to reach the database means "not ready"
        return JSONResponse({"status": "database unreachable"}, status_code=503)
    if current != head:
        body = {"status": "schema not at head", "current": current, "head": head}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "revision": current})


@router.get("/v1/status", response_model=StatusPublic, tags=["read"], responses=READ_ERRORS)
def status(conn: Conn, _: Reader) -> StatusPublic:
    """Counts by state, oldest pending age, throughput, live workers, endpoints, last batches."""
    return StatusPublic.model_validate(health.status(conn))
