"""Each endpoint state is decided from what the claim obeys (the endpoint row and its
budget), on a real PostgreSQL; and, as a law over any run of record batches, the
record statement writes exactly one audit row per rest that begins."""

from __future__ import annotations

import datetime as dt
import itertools

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoint_state import ENDPOINT_STATES, endpoint_states
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.schema import endpoint_budgets
from spark_outbox.core.settings import Breaker
from spark_outbox.dispatch import store
from tests.conftest import insert_endpoint
from tests.dispatcher import procs

BUDGETS = {
    # endpoint: (its row's values, its budget's values), one per state
    "gone-hook": ({"enabled": False, "paused_reason": "410 Gone: retired"}, {}),
    "old-hook": ({"archived_at": sa.func.now(), "enabled": False}, {}),
    "down-hook": (
        {"enabled": False, "paused_reason": "disabled automatically: failing continuously"},
        {"failures": 40},
    ),
    "busy-hook": ({"max_in_flight": 2}, {"in_flight": 2}),
    "slow-hook": (
        {"rate_limit_per_s": 0.01},
        {"tokens": 0.2, "refilled_at": sa.func.now()},
    ),
    "flaky-hook": (
        {},
        {"failures": 2, "failing_since": sa.func.now(), "last_failure": "HTTP 502"},
    ),
    "rest-hook": (
        {},
        {
            "failures": 9,
            "failing_since": sa.func.now(),
            "last_failure": "Timeout",
            "resting_until": sa.text("now() + interval '40 seconds'"),
        },
    ),
    "fine-hook": ({}, {"resting_until": sa.text("now() - interval '1 second'")}),
}


def test_each_state_is_read_from_the_endpoint_and_its_budget(engine: Engine) -> None:
    for name, (row, budget) in BUDGETS.items():
        insert_endpoint(engine, name, **row)
        if budget:
            with engine.begin() as conn:
                conn.execute(
                    sa.update(endpoint_budgets)
                    .where(endpoint_budgets.c.endpoint == name)
                    .values(**budget)
                )
    procs.enqueue_many(engine, 3, endpoint="rest-hook")
    with engine.connect() as conn:
        states = {s.name: s for s in endpoint_states(conn)}
    assert {n: s.state for n, s in states.items()} == {
        "gone-hook": "paused",
        "old-hook": "archived",
        "down-hook": "disabled",
        "busy-hook": "at_in_flight_limit",
        "slow-hook": "rate_limited",
        "flaky-hook": "failing",
        "rest-hook": "resting",
        "fine-hook": "ready",  # a rest that ran out holds nothing back
    }
    assert {s.state for s in states.values()} == set(ENDPOINT_STATES)
    assert states["gone-hook"].why == "paused: 410 Gone: retired"
    assert states["busy-hook"].why == "at its in-flight limit: 2 of 2"
    assert states["slow-hook"].why == "rate limited to 0.01/s: no token left now"
    assert states["flaky-hook"].why.startswith("2 failed attempts in a row since ")  # type: ignore[union-attr]
    rest = states["rest-hook"]
    assert rest.why.startswith("resting until ") and rest.why.endswith("the last: Timeout")  # type: ignore[union-attr]
    assert rest.queue.depth == 3 and rest.failures == 9
    assert states["fine-hook"].resting_until is None and states["fine-hook"].why is None


_names = (f"law-{i}" for i in itertools.count())
BREAKER = Breaker(failures=3, base_s=30.0, max_s=60.0)
# A step: record a batch of outcomes (True: delivered), or let the running rest end.
steps = st.lists(
    st.one_of(st.lists(st.booleans(), min_size=1, max_size=4), st.just("rest ends")),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps)
def test_one_audit_row_per_rest_that_begins_whatever_the_batches(
    engine: Engine, run: list[list[bool] | str]
) -> None:
    name = next(_names)
    insert_endpoint(engine, name)
    outcomes = sum(len(s) for s in run if not isinstance(s, str))
    with engine.begin() as conn:
        for i in range(outcomes):
            enqueue(conn, idempotency_key=effect_key(name, i), endpoint=name, payload={})
    claimed = iter(store.claim(engine, "w", outcomes, 60))  # (earlier examples': due in 1 h)
    failures, resting, rests = 0, False, 0  # the model
    for step in run:
        if isinstance(step, str):
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE endpoint_budgets SET resting_until = now() - interval '1s' "
                        "WHERE endpoint = :name AND resting_until IS NOT NULL"
                    ),
                    {"name": name},
                )
            resting = False
            continue
        now = dt.datetime.now(dt.UTC)
        results = []
        for delivered in step:
            c = next(claimed)
            assert c.endpoint == name
            outcome = "delivered" if delivered else "retry"
            results.append(store.Result(c.id, c.lease_token, c.attempt, outcome, now, 1.0, 3600.0))
        store.record(engine, "w", results, breaker=BREAKER)
        if any(step):
            failures, resting = 0, False
        else:
            failures += len(step)
            if failures >= BREAKER.failures and not resting:
                resting, rests = True, rests + 1
    with engine.connect() as conn:
        got = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM operator_actions WHERE action = 'rest_endpoint' "
                "AND target = :name), failures, COALESCE(resting_until > now(), false) "
                "FROM endpoint_budgets WHERE endpoint = :name"
            ),
            {"name": name},
        ).one()
    assert tuple(got) == (rests, failures, resting)
