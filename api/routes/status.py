"""Health, readiness and the status overview."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from spark_outbox.api.deps import Conn, EngineDep, Reader
from spark_outbox.api.responses import READ_ERRORS
from spark_outbox.api.schemas import StatusPublic
from spark_outbox.console import health
from spark_outbox.core import revisions

router = APIRouter()


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    """The process is up (no database call: liveness, not readiness)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
def readyz(engine: EngineDep) -> JSONResponse:
    """Ready when PostgreSQL answers and the schema is at this release's head, or at a
    later release's (migrations are expand-only: an upgrade ahead of this API leaves it
    working, docs/operations.md "Upgrading")."""
    try:
        found = revisions.read(engine)
    except Exception:  # any failure to reach the database means "not ready"
        return JSONResponse({"status": "database unreachable"}, status_code=503)
    if not found.usable:
        body = {"status": "schema not at head", "current": found.current, "head": found.head}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "revision": found.current})


@router.get("/v1/status", response_model=StatusPublic, tags=["read"], responses=READ_ERRORS)
def status(conn: Conn, _: Reader) -> StatusPublic:
    """Counts by state, oldest pending age, throughput, live workers, endpoints, last batches."""
    return StatusPublic.model_validate(health.status(conn))
