"""The send-by law, property-tested against real dispatcher processes and a real receiver:
whatever the send-by times (around now), the leases, the claim sizes, the number of
workers and how slowly the receiver answers (so that claimed effects wait for a
sender, and leases run out), no effect reaches the receiver after its send-by time,
and every effect ends delivered, expired or dead: none is lost or left behind."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import uuid

import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply
from tests.invariants import assert_invariants

# The dispatcher stops at its check right before the first byte; the receiver notes
# the request when its handler starts, after the bytes crossed loopback and a thread
# switch: the wire's share, allowed here, on a machine shared with other work. A
# dispatcher that checked only at the claim sends seconds late in these plans.
WIRE_S = 0.5
FINAL = ("delivered", "expired", "dead")


@dataclasses.dataclass(frozen=True)
class Plan:
    expiries_s: list[float | None]  # per effect: its send-by time, seconds from enqueue
    replies: list[tuple[int, float]]  # the receiver's (status, delay), the last repeating
    workers: int
    concurrency: int
    claim_batch_size: int
    lease_s: float


# Few senders, a slow receiver and claims of several effects: claimed effects wait
# for a sender (up to half a lease, then they are handed back), and most send-by
# times fall inside those waits.
plans = st.builds(
    Plan,
    expiries_s=st.lists(
        st.one_of(
            st.none(),
            st.floats(-1.0, 0.0),
            st.floats(0.2, 4.0),
            st.floats(0.2, 4.0),
            st.floats(0.2, 4.0),
        ).map(lambda s: None if s is None else round(s, 2)),
        min_size=4,
        max_size=14,
    ),
    replies=st.lists(
        st.tuples(st.sampled_from([200, 200, 200, 503]), st.sampled_from([0.0, 0.2, 0.5, 0.8])),
        min_size=1,
        max_size=6,
    ),
    workers=st.integers(1, 2),
    concurrency=st.integers(1, 2),
    claim_batch_size=st.integers(2, 8),
    lease_s=st.sampled_from([1.0, 3.0, 6.0]),
)


def _start(engine: Engine, db_url: str, plan: Plan, tag: str) -> list[subprocess.Popen[bytes]]:
    env = procs.worker_env(
        db_url,
        # A receiver that ends answering 503 makes a failing streak: the circuit breaker
        # then rests the endpoint up to its default 60 s, doubling from 1 s, and a plan
        # outlasted the wait below (effects due, unclaimed, while it rested). Rests of
        # at most 1 s keep the breaker in play and every plan within the wait.
        OUTBOX_BREAKER_MAX_S="1",
        OUTBOX_LEASE_S=str(plan.lease_s),
        OUTBOX_CONCURRENCY=str(plan.concurrency),
        OUTBOX_CLAIM_BATCH_SIZE=str(plan.claim_batch_size),
    )
    started = [procs.start(env | {"OUTBOX_WORKER_ID": f"{tag}-{i}"}) for i in range(plan.workers)]
    procs.wait_for(lambda: _live(engine, tag) == plan.workers, 60, "the workers' first beat")
    return started


def _live(engine: Engine, tag: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM worker_heartbeats WHERE worker_id LIKE :t"),
                {"t": f"{tag}-%"},
            ).scalar_one()
        )


def _states(engine: Engine, endpoint: str) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT idempotency_key, state, last_error FROM effects WHERE endpoint = :e"),
            {"e": endpoint},
        ).all()
    return {key: (state, error) for key, state, error in rows}


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# One sender, a receiver taking 0.8 s a request, six effects due at once with send-by
# times 1.5 s away: the fourth and later wait past theirs, claimed and leased.
@example(
    plan=Plan(
        expiries_s=[None, 1.5, 1.5, 1.5, 1.5, 1.5],
        replies=[(200, 0.8)],
        workers=1,
        concurrency=1,
        claim_batch_size=8,
        lease_s=6.0,
    )
)
@given(plan=plans)
def test_no_effect_reaches_the_receiver_after_its_send_by_time_and_none_is_lost(
    db_url: str, engine: Engine, receiver: Receiver, plan: Plan
) -> None:
    tag = uuid.uuid4().hex[:8]
    path, endpoint = f"/{tag}", f"hook-{tag}"
    receiver.script(path, *(Reply(status, delay_s=delay) for status, delay in plan.replies))
    with engine.begin() as conn:
        add_webhook(conn, name=endpoint, url=receiver.url(path))
    workers = _start(engine, db_url, plan, tag)
    try:
        expiry: dict[str, dt.datetime | None] = {}
        already_past: set[str] = set()
        for i, offset_s in enumerate(plan.expiries_s):
            key = effect_key("expiry-law", tag, i)
            now = dt.datetime.now(dt.UTC)
            expiry[key] = None if offset_s is None else now + dt.timedelta(seconds=offset_s)
            if offset_s is not None and offset_s <= 0:
                already_past.add(key)
            with engine.begin() as conn:
                enqueue(conn, idempotency_key=key, endpoint=endpoint, payload={"i": i},
                        expires_at=expiry[key])  # fmt: skip
        procs.wait_for(
            lambda: all(s in FINAL for s, _ in _states(engine, endpoint).values()),
            90,
            "every effect to end delivered, expired or dead",
        )
    finally:
        for worker in workers:
            procs.stop(worker)
    received = receiver.seen(path)
    for request in received:
        key = request.headers["webhook-id"]
        send_by = expiry[key]
        assert key not in already_past, f"{key}: its send-by time had passed at enqueue"
        if send_by is not None:
            late_s = request.at - send_by.timestamp()
            assert late_s < WIRE_S, f"{key} arrived {late_s:.3f} s after its send-by time"
    states = _states(engine, endpoint)
    assert set(states) == set(expiry)  # none lost
    received_keys = {r.headers["webhook-id"] for r in received}
    for key, (state, error) in states.items():
        if state == "delivered":
            assert key in received_keys
        if state == "expired":
            assert expiry[key] is not None and error is not None and error.startswith("not sent")
    assert_invariants(engine)  # among them: no attempt started at or after its send-by time
