"""Every numeric endpoint setting is bounded at input: the API refuses 1e308, NaN,
infinities, negatives and zero where it means nothing, with a 422 naming the field
and the fix; and whatever number it does store leaves the claim working."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.dispatch import store
from tests.api.conftest import Tokens
from tests.conftest import insert_endpoint

REFUSED = [
    ("rate_limit_per_s", 1e308),
    ("rate_limit_per_s", float("nan")),
    ("rate_limit_per_s", float("inf")),
    ("rate_limit_per_s", -1),
    ("rate_limit_per_s", 0),
    ("rate_limit_per_s", 1_000_001),
    ("max_in_flight", 1e308),
    ("max_in_flight", 10**30),
    ("max_in_flight", float("-inf")),
    ("max_in_flight", 0),
    ("max_in_flight", -3),
    ("timeout_s", 1e308),
    ("timeout_s", float("nan")),
    ("timeout_s", 0),
    ("timeout_s", -10),
    ("timeout_s", None),
    ("retry_schedule_s", [0, 1e308]),
    ("retry_schedule_s", [float("nan")]),
    ("retry_schedule_s", [5, -1]),
    ("retry_schedule_s", [float("inf")]),
    ("retry_schedule_s", []),
]


def _send(client: TestClient, method: str, path: str, body: dict[str, Any], auth: Any) -> Any:
    # json.dumps writes NaN and Infinity as the bare words Python's parser (the API's) reads.
    headers = auth | {"Content-Type": "application/json"}
    return client.request(method, path, content=json.dumps(body), headers=headers)


def _refusal(answer: Any, field: str) -> str:
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail and all(field in "".join(map(str, d["loc"])) for d in detail), detail
    return str(detail[0]["msg"])


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_patch_out_of_bounds_is_refused_naming_the_field_and_changes_nothing(
    client: TestClient, api_tokens: Tokens, engine: Engine, field: str, value: object
) -> None:
    body = {"reason": "try", field: value}
    answer = _send(
        client, "PATCH", "/v1/endpoints/billing-webhook", body, api_tokens.auth("operator")
    )
    message = _refusal(answer, field)
    assert "give" in message or "should" in message  # the fix, or pydantic's own range
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT timeout_s, retry_schedule_s, rate_limit_per_s, max_in_flight"
                " FROM endpoints WHERE name = 'billing-webhook'"
            )
        ).one()
    assert tuple(row) == (10.0, None, None, None)


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_new_endpoint_out_of_bounds_is_refused_naming_the_field(
    client: TestClient, api_tokens: Tokens, field: str, value: object
) -> None:
    body = {"reason": "try", "name": "partner", "url": "https://partner.example.com/h"}
    answer = _send(
        client, "POST", "/v1/endpoints", body | {field: value}, api_tokens.auth("operator")
    )
    _refusal(answer, field)


def test_the_refusal_of_a_huge_rate_says_the_range(client: TestClient, api_tokens: Tokens) -> None:
    body = {"reason": "try", "rate_limit_per_s": 1e308}
    answer = _send(
        client, "PATCH", "/v1/endpoints/billing-webhook", body, api_tokens.auth("operator")
    )
    assert answer.json()["detail"][0]["loc"] == ["body", "rate_limit_per_s"]
    assert "give 0.001 to 1000000 sends per second" in _refusal(answer, "rate_limit_per_s")


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
)
VALUES = st.sampled_from(["rate_limit_per_s", "max_in_flight", "timeout_s"]).flatmap(
    lambda field: st.tuples(st.just(field), NUMBERS)
) | st.tuples(st.just("retry_schedule_s"), st.lists(NUMBERS, min_size=1, max_size=3))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(change=VALUES)
def test_any_number_is_refused_naming_its_field_or_stored_with_the_claim_still_working(
    client: TestClient, api_tokens: Tokens, engine: Engine, change: tuple[str, Any]
) -> None:
    field, value = change
    body = {"reason": "fuzz", field: value}
    answer = _send(
        client, "PATCH", "/v1/endpoints/billing-webhook", body, api_tokens.auth("operator")
    )
    if answer.status_code == 422:
        _refusal(answer, field)
        return
    assert answer.status_code == 200, answer.text
    # Stored: an effect due on it and one on another endpoint; a claim takes the other's.
    n = next(_COUNTER)
    if n == 0:
        insert_endpoint(engine, "other-webhook")
    keys = {name: effect_key("fuzz", n, name) for name in ("billing-webhook", "other-webhook")}
    with engine.begin() as conn:
        for name, key in keys.items():
            enqueue(conn, idempotency_key=key, endpoint=name, payload={"n": n})
    claimed = {c.idempotency_key for c in store.claim(engine, "fuzz", 100, 30)}
    assert keys["other-webhook"] in claimed


_COUNTER = itertools.count()
