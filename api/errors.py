"""The one table that maps domain errors to HTTP status codes.

Domain errors (``spark_outbox.core.errors`` and friends) know nothing of HTTP; routes
let them propagate and this module shapes the response. A 422 from the domain
(a bad filter, an empty reason) uses FastAPI's own validation-error shape, with
``loc`` naming the field and ``msg`` saying the problem and the fix, so clients
see one 422 format.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from spark_outbox.api.routes.ui import error_page
from spark_outbox.console.tokens import AuthenticationFailed, PermissionDenied
from spark_outbox.core.errors import (
    ConfigurationError,
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    OutboxError,
)

log = logging.getLogger(__name__)

UNAVAILABLE = "the database is unavailable; retry"

STATUS_OF: dict[type[OutboxError], int] = {
    AuthenticationFailed: 401,
    PermissionDenied: 403,
    NotFound: 404,
    Conflict: 409,
    InvalidInput: 422,
    ConfigurationError: 500,
    DatabaseUnavailable: 503,
}


def status_for(exc: OutboxError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 500


def _json(exc: OutboxError, request: Request) -> JSONResponse:
    status = status_for(exc)
    if status == 422 and isinstance(exc, InvalidInput):
        where = "query" if request.method == "GET" else "body"
        item = {
            "loc": [where, exc.field],
            "msg": f"{exc.problem}; {exc.fix}",
            "type": "value_error",
        }
        return JSONResponse({"detail": [item]}, status_code=422)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)


def _logged(exc: DatabaseUnavailable) -> DatabaseUnavailable:
    """The cause (host, port, the driver's text) goes to the server log; every client,
    signed in or not, and every page get the same words without it."""
    log.error(
        "database unavailable", extra={"event": "api.database_unavailable", "error": str(exc)}
    )
    return DatabaseUnavailable(UNAVAILABLE)


def _json_safe(value: Any) -> Any:
    """A 422 echoes the input: a NaN or an infinity (Python's JSON parser reads them)
    is not JSON, and the default handler failed on it (a 500); it is echoed as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and not value.isascii():
        # A lone surrogate (JSON's "\ud800" parses to one) cannot be encoded as UTF-8:
        # echoed escaped.
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def install(app: FastAPI) -> None:
    """Register the handlers; the support page renders its own error pages."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        detail = _json_safe(jsonable_encoder(exc.errors()))
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(OutboxError)
    async def outbox_error(request: Request, exc: OutboxError) -> Response:
        if isinstance(exc, DatabaseUnavailable):
            exc = _logged(exc)
        if request.url.path.startswith("/ui"):
            return error_page(request, exc, status_for(exc))
        return _json(exc, request)
