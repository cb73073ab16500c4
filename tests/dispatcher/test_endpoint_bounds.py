"""No single endpoint row can break the claim that every endpoint shares, even one
written by SQL directly: the database holds the bounds of dispatcher/bounds.py
(migration 1525), and a real worker keeps delivering to the other endpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import re

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import bounds
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker


def _write(engine: Engine, name: str, column: str, value: object) -> bool:
    """Set one column by SQL; False when the database refused it (a CHECK)."""
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(f"UPDATE endpoints SET {column} = :v WHERE name = :n"),
                {"v": value, "n": name},
            )
    except sa.exc.IntegrityError as exc:
        assert f"ck_endpoints_{column}_bounds" in str(exc)
        return False
    return True


def _outside(b: bounds.Bound) -> list[float]:
    step = 1 if b.integer else 1e-9
    below = [b.low] if b.above_low else [b.low - step]
    floats = [] if b.integer else [float("nan"), float("inf"), float("-inf"), 1e308]
    return [*below, b.high + step, -1, *floats]


@pytest.mark.parametrize("bound", list(bounds.BOUNDS.values()), ids=lambda b: b.field)
def test_the_database_holds_each_settings_bounds(engine: Engine, bound: bounds.Bound) -> None:
    insert_endpoint(
        engine, "mail", kind="email", url=None, signing_secret=None,
        smtp_host="127.0.0.1", smtp_port=25, mail_from="a@example.com",
    )  # fmt: skip
    inside = [bound.high] if bound.above_low else [bound.low, bound.high]
    assert all(_write(engine, "mail", bound.field, v) for v in inside)
    assert [v for v in _outside(bound) if _write(engine, "mail", bound.field, v)] == []


def test_the_database_holds_the_retry_schedules_bounds(engine: Engine) -> None:
    insert_endpoint(engine, "hook")
    high = bounds.RETRY_DELAY_S.high
    for fine in ([0.0], [0.0, high], [5.0] * bounds.MAX_RETRIES, None):
        assert _write(engine, "hook", "retry_schedule_s", fine), fine
    for bad in (
        [], [-1.0], [high + 1], [float("nan")], [float("inf")], [0.0, None],
        [5.0] * (bounds.MAX_RETRIES + 1),
    ):  # fmt: skip
        assert not _write(engine, "hook", "retry_schedule_s", bad), bad
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE endpoints SET retry_schedule_s = NULL"))
    nested = "UPDATE endpoints SET retry_schedule_s = ARRAY[ARRAY[1.0], ARRAY[2.0]]"
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text(nested))


@pytest.mark.parametrize(
    "change",
    ["in_flight = -2147483648", "refilled_at = '-infinity'", "refilled_at = 'infinity'"],
)
def test_a_budget_row_the_claim_cannot_compute_from_is_refused(engine: Engine, change: str) -> None:
    # Each of these, written by SQL, made every claim fail (integer out of range,
    # cannot subtract infinite timestamps) for every endpoint.
    insert_endpoint(engine, "hook", rate_limit_per_s=5.0, max_in_flight=10)
    with pytest.raises(sa.exc.IntegrityError, match="ck_endpoint_budgets_"), engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE endpoint_budgets SET {change}"))


def _two_endpoints(engine: Engine, receiver: Receiver, n: int) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for name in ("huge", "calm"):
        insert_endpoint(engine, name, url=receiver.url(f"/{name}"))
        keys[name] = [effect_key(name, i) for i in range(n)]
    with engine.begin() as conn:
        for name, found in keys.items():
            for key in found:
                enqueue(conn, idempotency_key=key, endpoint=name, payload={})
    return keys


def test_a_huge_rate_written_by_sql_does_not_stop_the_claims_for_other_endpoints(
    fast: Settings, engine: Engine, receiver: Receiver
) -> None:
    receiver.script("/huge", 200)
    receiver.script("/calm", 200)
    keys = _two_endpoints(engine, receiver, 5)
    # Refused by the database now; before, stored, and every claim then overflowed
    # once the bucket had waited 2 s (the refill multiplies the rate by the wait).
    with contextlib.suppress(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text("UPDATE endpoints SET rate_limit_per_s = 1e308 WHERE name = 'huge'"))
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE endpoint_budgets SET refilled_at = now() - interval '1 minute'")
        )
    assert run_worker(fast, engine) == 0
    assert sorted(receiver.keys("/calm")) == sorted(keys["calm"])
    assert sorted(receiver.keys("/huge")) == sorted(keys["huge"])


def test_the_largest_settings_sql_may_write_leave_the_claim_working(
    fast: Settings, engine: Engine, receiver: Receiver
) -> None:
    receiver.script("/huge", 200)
    receiver.script("/calm", 200)
    keys = _two_endpoints(engine, receiver, 5)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE endpoints SET rate_limit_per_s = :rate, max_in_flight = :most,"
                " timeout_s = :timeout, retry_schedule_s = :schedule WHERE name = 'huge'"
            ),
            {
                "rate": bounds.RATE_LIMIT_PER_S.high,
                "most": bounds.MAX_IN_FLIGHT.high,
                "timeout": bounds.TIMEOUT_S.high,
                "schedule": [bounds.RETRY_DELAY_S.high] * bounds.MAX_RETRIES,
            },
        )
        # A bucket last refilled 30 years ago: the refill multiplies the rate by that.
        conn.execute(
            sa.text(
                "UPDATE endpoint_budgets SET refilled_at = now() - interval '30 years'"
                " WHERE endpoint = 'huge'"
            )
        )
    assert run_worker(dataclasses.replace(fast, lease_s=10.0), engine) == 0
    assert sorted(receiver.keys("/calm")) == sorted(keys["calm"])
    assert sorted(receiver.keys("/huge")) == sorted(keys["huge"])


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("0,1e308", "1e+308 is out of range"),
        ("nan", "nan is not a finite number"),
        ("5,-1", "-1 is out of range"),
        ("0,five", "is not a list of numbers"),
    ],
)
def test_the_dispatchers_own_retry_schedule_has_the_same_bounds(raw: str, said: str) -> None:
    with pytest.raises(
        ConfigurationError, match=f"OUTBOX_RETRY_SCHEDULE_S=.*{re.escape(said)}.*0,5,300"
    ):
        Settings.from_env({"OUTBOX_RETRY_SCHEDULE_S": raw})
    assert Settings.from_env({"OUTBOX_RETRY_SCHEDULE_S": "0,2592000"}).retry_schedule_s == (
        0.0,
        2592000.0,
    )
