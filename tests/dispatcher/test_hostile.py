"""Nothing a receiver sends back stops the worker (property-based, real everything).

Hypothesis draws, per effect, how a raw TCP receiver on loopback answers:
odd bytes (NUL, invalid UTF-8, control characters) in the status line, headers
and body, garbage, endless bodies, over-long header lines, drips, silence,
resets, hang-ups. A real worker drains real PostgreSQL; then every effect must
be delivered, retried (pending, due later) or dead, with every attempt it made
recorded, and no request may arrive after its effect was recorded delivered. An
endpoint drawn as not deduplicating may also leave it uncertain (the request
was handed over, no usable answer came), never resent; a deduplicating one never.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch.worker import Worker
from tests.dispatcher.hostile import KINDS, Behaviour, HostileReceiver

pytestmark = pytest.mark.slow

_odd = st.binary(max_size=40)
_header = st.tuples(st.binary(min_size=1, max_size=20).map(lambda b: b.replace(b":", b"")), _odd)
behaviours = st.builds(
    Behaviour,
    kind=st.sampled_from(KINDS),
    status=st.sampled_from([200, 201, 204, 301, 400, 404, 408, 410, 429, 500, 503, 599]),
    reason=_odd,
    headers=st.lists(
        st.one_of(
            _header,
            st.tuples(st.just(b"Retry-After"), st.text(max_size=12).map(str.encode)),
        ),
        max_size=4,
    ).map(tuple),
    body=st.binary(max_size=3000),
)
# Per effect: how it is answered, whether its endpoint retries twice or once, and
# whether it deduplicates (docs/dispatcher.md, "Uncertain sends").
cases = st.lists(st.tuples(behaviours, st.booleans(), st.booleans()), min_size=4, max_size=16)


@pytest.fixture(scope="module")
def worker_settings(server_url: str) -> Settings:
    import ipaddress

    return Settings.from_env(
        env={},
        worker_id="hostile",
        concurrency=16,
        lease_s=5.0,
        poll_interval_s=0.05,
        heartbeat_interval_s=0.5,
        shutdown_timeout_s=5.0,
        retry_after_cap_s=5.0,
        ssrf_allow_networks=(ipaddress.ip_network("127.0.0.0/8"),),
        log_format="text",
    )


@settings(
    max_examples=22,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=cases)
def test_no_answer_a_receiver_can_send_stops_the_worker_or_loses_an_outcome(
    server_url: str,
    template_name: str,
    worker_settings: Settings,
    drawn: list[tuple[Behaviour, bool, bool]],
) -> None:
    url = scratch.clone_template(server_url, template_name)
    engine = db.create_engine(url)
    try:
        s = dataclasses.replace(worker_settings, database_url=url)
        receiver, code = asyncio.run(_drain(engine, s, drawn))
        assert code == 0  # the worker stayed up and stopped cleanly
        _check(engine, receiver, {effect_key("hostile", i): d for i, (_, _, d) in enumerate(drawn)})
    finally:
        engine.dispose()
        scratch.drop_database(server_url, scratch.database_name(url))


async def _drain(
    engine: sa.Engine, s: Settings, drawn: list[tuple[Behaviour, bool, bool]]
) -> tuple[HostileReceiver, int]:
    receiver = HostileReceiver()
    await receiver.start()
    try:
        with engine.begin() as conn:
            for i, (behaviour, twice, deduplicates) in enumerate(drawn):
                # One endpoint per effect: no circuit breaker couples their fates.
                schedule = (0, 0.05, 30.0) if twice else (0, 0.05)
                name = f"hook-{i}"
                add_webhook(
                    conn,
                    name=name,
                    url=receiver.url(),
                    timeout_s=0.5,
                    retry_schedule_s=schedule,
                    deduplicates=deduplicates,
                )
                key = effect_key("hostile", i)
                receiver.behaviours[key] = behaviour
                enqueue(conn, idempotency_key=key, endpoint=name, payload={"n": i})
        worker = Worker(s, engine, database_url=s.database_url, until_idle=True, idle_within_s=1.0)
        code = await asyncio.wait_for(worker.run(), 60)
    finally:
        await receiver.close()
    return receiver, code


def _check(engine: sa.Engine, receiver: HostileReceiver, deduplicates: dict[str, bool]) -> None:
    with engine.connect() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        effects = conn.execute(
            sa.text(
                "SELECT e.idempotency_key, e.state, e.next_attempt_at, e.delivered_at,"
                " e.attempt_count, count(a.id) AS rows,"
                " max(octet_length(a.response_excerpt)) AS excerpt_bytes,"
                " (array_agg(a.outcome ORDER BY a.id DESC))[1] AS last_outcome"
                " FROM effects e LEFT JOIN delivery_attempts a ON a.effect_id = e.id"
                " GROUP BY e.id"
            )
        ).all()
    assert len(effects) == len(deduplicates)  # nothing lost
    for key, state, next_at, delivered_at, attempt_count, rows, excerpt_bytes, last in effects:
        finished = ("delivered", "pending", "dead")
        allowed = finished if deduplicates[key] else (*finished, "uncertain")
        assert state in allowed, (key, state, deduplicates[key])
        if state == "uncertain":  # handed over, no usable answer: recorded, not resent
            assert last == "uncertain" and any(k == key for k, _ in receiver.arrivals), key
        if state == "pending":
            assert next_at > now, (key, next_at, now)  # retried: due later, not stuck
        # Every attempt made was recorded (none lost between send and record).
        assert rows >= 1 and rows == attempt_count, (key, rows, attempt_count)
        assert excerpt_bytes is None or excerpt_bytes <= 2048
        arrivals = [at for k, at in receiver.arrivals if k == key]
        assert len(arrivals) <= attempt_count  # the receiver never saw more than we tried
        if state == "delivered":
            cutoff = delivered_at.timestamp()
            assert all(at < cutoff for at in arrivals), (key, arrivals, delivered_at)


def _outcomes(engine: sa.Engine, key: str) -> tuple[str, list[tuple[str, str | None, str | None]]]:
    """The effect's state and its attempts (outcome, error class, error), in order."""
    with engine.connect() as conn:
        state = conn.execute(
            sa.text("SELECT state FROM effects WHERE idempotency_key = :k"), {"k": key}
        ).scalar_one()
        rows = conn.execute(
            sa.text(
                "SELECT a.outcome, a.error_class, a.error FROM delivery_attempts a"
                " JOIN effects e ON e.id = a.effect_id WHERE e.idempotency_key = :k"
                " ORDER BY a.id"
            ),
            {"k": key},
        ).all()
    return state, [(r[0], r[1], r[2]) for r in rows]


def _drained(
    engine: sa.Engine, s: Settings, drawn: list[tuple[Behaviour, bool, bool]]
) -> HostileReceiver:
    receiver, code = asyncio.run(_drain(engine, s, drawn))
    assert code == 0
    return receiver


def test_an_endless_trailer_section_ends_as_a_recorded_failure_naming_the_trailers(
    engine: sa.Engine, worker_settings: Settings, db_url: str
) -> None:
    """A 200 whose chunked body ends in 64 MiB of trailers was recorded delivered
    after the dispatcher had read them all into memory. Now the send is refused
    once head and trailers pass 16 KiB: retried, then dead, on a deduplicating
    endpoint; uncertain (sent once) on one that cannot deduplicate."""
    s = dataclasses.replace(worker_settings, database_url=db_url)
    drawn = [(Behaviour("trailers"), False, True), (Behaviour("trailers"), False, False)]
    receiver = _drained(engine, s, drawn)
    state, attempts = _outcomes(engine, effect_key("hostile", 0))
    assert state == "dead" and [a[:2] for a in attempts] == [
        ("retry", "BadResponse"),
        ("dead", "BadResponse"),
    ]
    assert all("trailers over 16384 bytes" in (a[2] or "") for a in attempts)
    state, attempts = _outcomes(engine, effect_key("hostile", 1))
    assert state == "uncertain" and [a[:2] for a in attempts] == [("uncertain", "BadResponse")]
    assert "handed over, then no readable answer" in (attempts[0][2] or "")
    assert [k for k, _ in receiver.arrivals].count(effect_key("hostile", 1)) == 1


def test_interim_answers_before_a_2xx_end_delivered(
    engine: sa.Engine, worker_settings: Settings, db_url: str
) -> None:
    """100 Continue and 103 Early Hints, then 201: delivered (the 1xx was taken as
    the final answer and dead-lettered the effect)."""
    s = dataclasses.replace(worker_settings, database_url=db_url)
    _drained(engine, s, [(Behaviour("interim", status=201, body=b"made"), False, True)])
    state, attempts = _outcomes(engine, effect_key("hostile", 0))
    assert state == "delivered" and [a[0] for a in attempts] == ["delivered"]


def test_a_head_broken_after_its_status_line_is_uncertain_where_the_endpoint_cannot_deduplicate(
    engine: sa.Engine, worker_settings: Settings, db_url: str
) -> None:
    """The receiver got the whole request and answered a status line, then a broken
    header line: it may have acted on it, and a resend most likely meets the same
    answer. Not deduplicating: uncertain, sent once (it was retried, the receiver
    getting the effect again and again). Deduplicating: retried as before."""
    s = dataclasses.replace(worker_settings, database_url=db_url)
    drawn = [(Behaviour("broken_head"), True, False), (Behaviour("broken_head"), True, True)]
    receiver = _drained(engine, s, drawn)
    arrivals = [k for k, _ in receiver.arrivals]
    state, attempts = _outcomes(engine, effect_key("hostile", 0))
    assert state == "uncertain" and [a[:2] for a in attempts] == [("uncertain", "BadResponse")]
    assert arrivals.count(effect_key("hostile", 0)) == 1
    state, attempts = _outcomes(engine, effect_key("hostile", 1))
    assert state == "pending" and [a[0] for a in attempts] == ["retry", "retry"]
    assert arrivals.count(effect_key("hostile", 1)) == 2
