"""The OpenAPI schema is the contract: schemathesis finds no 5xx and no off-schema response.

Runs against the real app (ASGI, real PostgreSQL with realistic rows) with an
operator token, so every route, the write ones included, is exercised past
authentication. Bounded by max_examples to keep the API suite fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.python import asgi
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.core.settings import Settings
from tests.api.builders import story
from tests.api.conftest import Tokens

MAX_EXAMPLES = 15
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]


@pytest.fixture
def contract_app(api_settings: Settings, endpoints: None, engine: Engine) -> Iterator[FastAPI]:
    story(engine)
    yield create_app(api_settings)


def _exercise(operation: Any, headers: dict[str, str]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()


@pytest.mark.slow
def test_api_honours_its_openapi_contract(contract_app: FastAPI, api_tokens: Tokens) -> None:
    """Every operation of the served schema, fuzzed (schemathesis drives the app's lifespan)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", contract_app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12  # the schema really lists the API
    try:
        for operation in operations:
            _exercise(operation, api_tokens.auth("operator"))
    finally:
        asgi.shutdown_lifespans()  # dispose of the app's engine before its database is dropped
