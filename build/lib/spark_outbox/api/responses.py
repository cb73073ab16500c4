"""The error responses each route documents, so the OpenAPI contract lists them."""

from __future__ import annotations

from typing import Any

from spark_outbox.api.schemas import ErrorPublic

_E: dict[str, Any] = {"model": ErrorPublic}

READ_ERRORS: dict[int | str, dict[str, Any]] = {401: _E}
LOOKUP_ERRORS: dict[int | str, dict[str, Any]] = {401: _E, 404: _E}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {401: _E, 403: _E, 404: _E, 409: _E}
