"""The dispatcher's store: the only code that runs the claim / record / release SQL.

Every statement is named in ``store.sql`` with the reason it exists. Claims and
records are batched (one round trip for up to ``claim_batch_size`` effects);
nothing reads the outbox by a sequence cursor, because rows commit out of order.
Calls are synchronous (psycopg2); the worker runs them in a thread. Every call
is one statement, atomic on its own, so the dispatcher's engine runs in
autocommit (``ENGINE_OPTIONS``): one round trip per call, no BEGIN/COMMIT.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from spark_outbox.core import counts, endpoint_state, queue, tracing
from spark_outbox.core.settings import DEFAULT_BREAKER, Breaker, Settings
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.dispatch import prepared as _prepared

_Q = queries_beside(__file__, "store.sql")
log = logging.getLogger(__name__)

# How the dispatcher's engine is built: db.create_engine(url, **ENGINE_OPTIONS).
# - The planner settings keep the claim on ix_effects_due in order, stopping at
#   LIMIT: right after a big batch commit the table has no fresh statistics and
#   the planner would bitmap-scan and sort every due row instead (measured: 39 ms
#   vs 6 ms per claim with 30k due). No other dispatcher statement sorts.
# - Claims, releases and heartbeats commit without waiting for the WAL flush
#   (an fsync took ~4 ms here, on the path from a producer's COMMIT to the send).
#   Safe: a claim lost in a PostgreSQL crash leaves its effect due again (an
#   in-flight send is at-least-once anyway, and its late record is 'stale'), and
#   ``record`` commits durably: WAL is flushed in order, so a durable record
#   makes its claim durable too. Outcomes and the key ledger are never at risk.
SESSION_SETTINGS = {
    "enable_bitmapscan": "off",
    "enable_sort": "off",
    "synchronous_commit": "off",
    "jit": "off",
}
ENGINE_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "pre_ping": False,  # DbCalls retries every call on a lost connection
    "session_settings": SESSION_SETTINGS,
}


def engine_options(settings: Settings) -> dict[str, Any]:
    """``ENGINE_OPTIONS``, less the connection options when ``startup_options`` is off
    (PgBouncer refuses them; the role carries the settings: ``role_settings_missing``)."""
    if settings.startup_options:
        return ENGINE_OPTIONS
    return {k: v for k, v in ENGINE_OPTIONS.items() if k != "session_settings"}


def role_settings_missing(engine: Engine) -> dict[str, str]:
    """The settings of ``SESSION_SETTINGS`` a connection does not have, with their
    values now (checked once at start when they are not sent as options)."""
    with engine.connect() as conn:
        rows = conn.execute(_Q["session_settings"], {"names": list(SESSION_SETTINGS)}).all()
    now: dict[str, str] = {str(r[0]): str(r[1]) for r in rows}
    return {k: now.get(k, "?") for k, v in SESSION_SETTINGS.items() if now.get(k) != v}


# Outcomes an attempt can record (docs/design.md, glossary); 'stale' is decided by the SQL.
# 'uncertain': the message was handed over to an endpoint that cannot deduplicate
# and no answer came back (docs/dispatcher.md, "Uncertain sends"). 'expired': its
# send-by time passed before the first byte; nothing was sent.
OUTCOMES = ("delivered", "retry", "dead", "gone", "uncertain", "expired")


# Claimed, Result and Sent (channels) are made once per delivery: slots and not
# frozen, since a frozen dataclass's __init__ sets each field through
# object.__setattr__ (measured: 1.16 us against 0.45 for Claimed's eight fields).
@dataclasses.dataclass(slots=True)
class Claimed:
    """One leased effect: what a channel needs to send it, and its fence token."""

    id: int
    idempotency_key: str
    endpoint: str
    recipient: str | None
    payload: str
    attempt: int
    lease_token: str
    # time.monotonic() by which the lease has surely expired (taken before the claim).
    lease_deadline: float = 0.0
    # Tracing on only: the effect's traces.EffectTrace (None: tracing is off).
    trace: Any = None
    # time.monotonic() from which it must not be sent (its send-by time; None: none):
    # the seconds the database had left, counted from before the claim, so never
    # later than the send-by time on the database's clock.
    send_by: float | None = None


@dataclasses.dataclass(slots=True)
class Result:
    """The outcome of one attempt, as the worker hands it to ``record``."""

    effect_id: int
    lease_token: str
    attempt: int
    outcome: str
    started_at: dt.datetime
    duration_ms: float
    delay_s: float = 0.0
    error: str | None = None
    status_code: int | None = None
    error_class: str | None = None
    response_excerpt: str | None = None
    # For logs and metrics only (not written by ``record``).
    endpoint: str = ""
    idempotency_key: str = ""
    # The attempt's send span (W3C traceparent): tracing on only.
    trace_parent: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """What one claim leased, and whether it took all it asked for (more may be due)."""

    effects: list[Claimed]
    full: bool


class Statements:
    """How one worker runs its claims and records: the plan-cache policy, in one
    place, made from the settings; the worker and the recorder only call it.

    Off (``OUTBOX_PREPARED_STATEMENTS=0``, behind a PgBouncer in transaction pooling
    mode): every statement is planned per call. On: every record runs as a statement
    prepared once per connection (``spark_outbox.dispatch.prepared``), and a claim does after a
    short claim (little is due: most of a claim's cost is then its planning), at one
    of a few sizes (``prepared.size_of``), each its own statement per connection.
    Under a backlog the claim is planned per call: PostgreSQL chose custom plans
    there anyway, and the prepared path measured ~8 % fewer deliveries/s
    (bench/RESULTS.md).

    Per connection, ``spark_outbox.dispatch.prepared`` keeps which of them it holds and since
    when (a plan lives 1 s; a statement the server lost is prepared again). One per
    worker: it remembers how much its last claim found (a worker claims one batch
    at a time)."""

    def __init__(
        self, *, prepared: bool = False, batch_size: int = 500, breaker: Breaker = DEFAULT_BREAKER
    ) -> None:
        self.prepared = prepared
        self.breaker = breaker  # the circuit breaker's policy, applied by the record
        self._batch_size = batch_size
        self._last_claimed = 0  # effects the last claim returned (none before the first)

    @classmethod
    def from_settings(cls, settings: Settings) -> Statements:
        return cls(
            prepared=settings.prepared_statements,
            batch_size=settings.claim_batch_size,
            breaker=settings.breaker,
        )

    def claim(self, engine: Engine, worker_id: str, room: int, lease_s: float) -> Claim:
        """Lease up to ``room`` (at most a batch) due effects; prepared after a short
        claim, then rounded down to its statement's size."""
        short = self.prepared and _prepared.is_short(self._last_claimed, self._batch_size)
        limit = _prepared.size_of(room, self._batch_size) if short else room
        leased = lease(engine, worker_id, limit, lease_s, prepared=short)
        self._last_claimed = len(leased.effects)
        return leased

    def record(
        self, engine: Engine, worker_id: str, results: Sequence[Result]
    ) -> dict[tuple[int, str], bool]:
        """``record``, prepared when preparation is on, resting endpoints by ``breaker``."""
        return record(engine, worker_id, results, prepared=self.prepared, breaker=self.breaker)


def claim(
    engine: Engine, worker_id: str, limit: int, lease_s: float, *, prepared: bool = False
) -> list[Claimed]:
    """Lease up to ``limit`` due effects; keys already delivered are settled, not returned."""
    return lease(engine, worker_id, limit, lease_s, prepared=prepared).effects


def lease(
    engine: Engine, worker_id: str, limit: int, lease_s: float, *, prepared: bool = False
) -> Claim:
    """``claim``, and whether more may be due: the claim took ``limit`` rows, or an
    endpoint filled its fair share of them (store.sql).

    ``prepared``: run the claim as a statement prepared once per connection and
    ``limit`` (``spark_outbox.dispatch.prepared``: planning was ~70 % of a small claim's cost);
    ``Statements`` asks for it after a short claim, with few distinct limits
    (``prepared.size_of``). Otherwise the claim is planned per call.
    """
    params = {"worker_id": worker_id, "lease_s": lease_s}
    before = time.monotonic()
    deadline = before + lease_s
    with engine.begin() as conn:
        if prepared:
            rows = _prepared.execute(conn, _claim_statement(limit), params).all()
        else:
            sizes = {"limit": limit, "window": CLAIM_WINDOW}
            rows = conn.execute(_Q["claim"], params | sizes).all()
    # Positional, in the order of the claim's RETURNING list (cheaper than mappings).
    effects = [
        Claimed(
            id=r[0],
            idempotency_key=r[1],
            endpoint=r[2],
            recipient=r[3],
            payload=r[4],
            attempt=r[5],
            lease_token=str(r[6]),
            lease_deadline=deadline,
            send_by=None if r[8] is None else before + r[8],
        )
        for r in rows
        if not r[7]
    ]
    return Claim(effects, full=len(rows) >= limit or any(r[9] for r in rows))


# How many due rows of an ordered endpoint one claim looks at, at most (its front,
# as the parking pass sees it): a claim's cost stays bounded however deep a key is.
CLAIM_WINDOW = 1000


@functools.cache
def _claim_statement(limit: int) -> _prepared.Statement:
    """The claim of store.sql with its ``limit`` written in: a generic plan of a
    parameter LIMIT guesses 10 % of the table (``spark_outbox.dispatch.prepared``)."""
    if limit < 1:
        raise ValueError(f"claim limit {limit}: at least 1")
    sql = _prepared.literal(_Q["claim"], limit=int(limit), window=CLAIM_WINDOW)
    types = {"worker_id": "text", "lease_s": "float8"}
    return _prepared.Statement(f"outbox_claim_{int(limit)}", sql, types)


def record(
    engine: Engine,
    worker_id: str,
    results: Sequence[Result],
    *,
    prepared: bool = False,
    breaker: Breaker = DEFAULT_BREAKER,
) -> dict[tuple[int, str], bool]:
    """Record outcomes in one statement; returns (effect id, lease token) -> recorded
    (False: the lease was lost, the attempt is logged as 'stale'). A failing streak
    rests its endpoint by the ``breaker`` policy (``Settings.breaker``).

    ``prepared``: the statement is prepared once per connection (its plan remade
    every second, ``spark_outbox.dispatch.prepared``): planned per call it cost ~0.7 ms of
    planning against ~0.5-1 ms executing at 1,000 effects/s, a record per few
    effects. A statement the server lost (a pooler's ``DISCARD ALL``) aborts the
    transaction: it is prepared again and the transaction run once more."""
    if not results:
        return {}
    for r in results:
        if r.outcome not in OUTCOMES:
            raise ValueError(f"outcome {r.outcome!r} is not one of {OUTCOMES}")
    params = {"worker_id": worker_id, "rows": _rows_json(results)} | breaker.params()
    # Its own transaction, durable at COMMIT whatever the session says (ENGINE_OPTIONS).
    for last_try in (False, True):
        try:
            with (
                engine.connect() as conn,
                conn.execution_options(isolation_level="READ COMMITTED").begin(),
            ):
                conn.execute(_Q["durable_commit"])
                if prepared:
                    rows = _prepared.execute(conn, _RECORD, params, retry_lost=False).all()
                else:
                    rows = conn.execute(_Q["record"], params).all()
            break
        except DBAPIError as exc:
            if last_try or not (prepared and _prepared.lost(exc)):
                raise
    ended = collections.Counter(str(row[3]) for row in rows if row[3] is not None)
    if ended:
        leases_ended(engine, ended)
    return {(int(row[0]), str(row[1])): bool(row[2]) for row in rows}


def _rows_json(results: Sequence[Result]) -> str:
    """The outcomes as the record statement reads them: one JSON array of arrays,
    in the order of its ``r`` CTE (``started_at`` as epoch seconds).

    ``allow_nan=False``: a NaN or an infinity would be JSON PostgreSQL refuses; it
    fails here instead, and the recorder's split finds the row (a ValueError)."""
    return json.dumps(
        [
            [
                r.effect_id, r.lease_token, r.outcome, float(r.delay_s), r.error, r.status_code,
                r.error_class, r.response_excerpt, r.started_at.timestamp(), r.duration_ms,
                r.attempt, r.trace_parent,
            ]
            for r in results
        ],
        allow_nan=False,
    )  # fmt: skip


# The record, prepared (the statement casts what it reads).
_RECORD = _prepared.Statement(
    "outbox_record",
    _Q["record"],
    {
        "worker_id": "text",
        "rows": "text",
        "breaker_failures": "int",
        "breaker_base_s": "float8",
        "breaker_max_s": "float8",
    },
)


def trace_contexts(engine: Engine, ids: Sequence[int]) -> dict[int, tracing.Carrier]:
    """Tracing on only: the trace context each effect was created in, by id (an
    effect created with tracing off has none)."""
    with engine.connect() as conn:
        rows = conn.execute(_Q["trace_contexts"], {"ids": list(ids)}).all()
    return {int(r[0]): tracing.Carrier(r[1], r[2]) for r in rows}


def leases_ended(engine: Engine, ended: Mapping[str, int]) -> None:
    """Take recorded leases off their endpoints' max_in_flight counts (store.sql)."""
    params = {"endpoints": list(ended), "ended": list(ended.values())}
    with engine.begin() as conn:
        conn.execute(_Q["leases_ended"], params)


def start_sends(engine: Engine, leases: Sequence[tuple[int, str]]) -> set[int]:
    """Record "this send started" for (effect id, lease token) pairs, durably, in one
    statement; returns the ids still ours (only those may be sent)."""
    if not leases:
        return set()
    params = {"ids": [i for i, _ in leases], "tokens": [t for _, t in leases]}
    with engine.connect() as conn, conn.execution_options(isolation_level="READ COMMITTED").begin():
        conn.execute(_Q["durable_commit"])
        return {int(row[0]) for row in conn.execute(_Q["start_sends"], params)}


def settle_uncertain(engine: Engine) -> list[tuple[str, str]]:
    """Expired leases of started sends become 'uncertain'; (key, endpoint) of each."""
    with engine.begin() as conn:
        return [(str(r[0]), str(r[1])) for r in conn.execute(_Q["settle_uncertain"])]


# Effects one expiry pass moves at most (the worker runs passes until one is short).
EXPIRE_LIMIT = 1000


def expire_due(engine: Engine, limit: int = EXPIRE_LIMIT) -> list[tuple[str, str]]:
    """Effects past their send-by time end 'expired' (store.sql, expire_due);
    (key, endpoint) of each."""
    with engine.begin() as conn:
        rows = conn.execute(_Q["expire_due"], {"limit": limit})
        return [(str(r[0]), str(r[1])) for r in rows]


# How many due rows of each ordered endpoint one parking pass looks at (the front
# of its range of ix_effects_due: what a claim walks first).
PARK_WINDOW = 1000
# A key is parked only when it holds this many of that front's rows or more: below
# it, a claim walks a few rows of the key; parking costs two more rewrites of each
# effect (parked, woken). 10 of 1,000: at least 100 keys in a front left as it is.
PARK_CROWDED = 10


def park_blocked(engine: Engine, window: int = PARK_WINDOW, crowded: int = PARK_CROWDED) -> int:
    """Park ordered endpoints' effects that wait behind an earlier one of their key
    (store.sql, park_blocked), of keys holding ``crowded`` or more of the front's
    ``window`` rows; how many were parked."""
    with engine.begin() as conn:
        params = {"window": window, "crowded": crowded}
        return int(conn.execute(_Q["park_blocked"], params).rowcount)


@dataclasses.dataclass(frozen=True)
class Release:
    """A lease handed back unsent, due again after ``delay_s``."""

    effect_id: int
    lease_token: str
    delay_s: float = 0.0


def release(engine: Engine, leases: Sequence[Release]) -> int:
    """Hand back unsent leases; returns how many were still ours."""
    if not leases:
        return 0
    params = {
        "ids": [r.effect_id for r in leases],
        "tokens": [r.lease_token for r in leases],
        "delays_s": [float(r.delay_s) for r in leases],
    }
    with engine.begin() as conn:
        return len(conn.execute(_Q["release"], params).all())


def due_soon(engine: Engine, within_s: float) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(_Q["due_soon"], {"within_s": within_s}).scalar())


def queue_stats(
    engine: Engine, refresh_after_s: float = queue.SNAPSHOT_MAX_AGE_S
) -> queue.QueueStats:
    """The queue's figures; beside a large backlog the snapshot, taken again by this
    call when older than ``refresh_after_s`` (``spark_outbox.core.queue``; the
    dispatcher's engine commits each statement)."""
    with engine.connect() as conn:
        return queue.queue_stats(conn, refresh_after_s=refresh_after_s)


def endpoint_states(engine: Engine) -> list[endpoint_state.EndpointState]:
    """What holds each endpoint back now (the progress line says it)."""
    with engine.connect() as conn:
        return endpoint_state.endpoint_states(conn)


def fold_counts(engine: Engine) -> int:
    """Keep the effect counts few rows (``spark_outbox.core.counts``); rows folded."""
    with engine.begin() as conn:
        return counts.fold(conn)


# "Failing continuously" needs this many failed attempts besides the time, so
# that one failure days ago does not disable an endpoint that was merely idle.
AUTO_DISABLE_MIN_FAILURES = 10


def auto_disable(engine: Engine, after_s: float) -> list[str]:
    """Disable the endpoints failing continuously for ``after_s`` (docs/dispatcher.md)."""
    with engine.begin() as conn:
        return disable_failing(conn, after_s)


def disable_failing(conn: Connection, after_s: float) -> list[str]:
    """Pause every endpoint failing continuously for ``after_s``; their names.

    Recorded in the audit log by ``system`` with the reason (also the endpoint's
    ``paused_reason``), in the same statement; ``outbox endpoints resume`` undoes it.
    """
    params = {"after_s": after_s, "min_failures": AUTO_DISABLE_MIN_FAILURES}
    done = conn.execute(_Q["auto_disable"], params).all()
    for name, reason in done:
        log.warning(
            "endpoint disabled automatically",
            extra={"event": "endpoint.auto_disabled", "endpoint": name, "reason": reason},
        )
    return [name for name, _ in done]


def heartbeat(engine: Engine, worker_id: str, in_flight: int, delivered: int, failed: int) -> None:
    params = {
        "worker_id": worker_id,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "in_flight": in_flight,
        "delivered": delivered,
        "failed": failed,
    }
    with engine.begin() as conn:
        conn.execute(_Q["heartbeat"], params)


def heartbeat_stopped(engine: Engine, worker_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(_Q["heartbeat_stopped"], {"worker_id": worker_id})
