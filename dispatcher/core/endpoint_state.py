"""What holds an endpoint back now, and why: read from the data the claim obeys.

"Nothing is sent" has many causes: the endpoint is paused (by an operator or a
410), disabled automatically, archived, resting under the circuit breaker, at its
in-flight limit, out of rate-limit tokens. Each is a fact in ``endpoints`` or its
``endpoint_budgets`` row, which the claim reads in its one statement; this module
reads the same facts, so what the status, the support page, the metrics and the
dispatcher's progress line say is what the dispatchers do. On the ground floor:
the hot path (progress line) and the console (status) both read it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy.engine import Connection

from spark_outbox.core.queue import Queue, QueueStats, queue
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "endpoint_state.sql")

# The states, most binding first: an endpoint is in the first that holds. The
# metrics export one series per state, and the dashboard and alerts read them by
# name, so a state added here appears everywhere.
ENDPOINT_STATES = (
    "archived",
    "disabled",  # paused by the system: failing continuously (dispatch/store.sql)
    "paused",  # by an operator, or by a 410 Gone
    "resting",  # the circuit breaker: no dispatcher claims for it until resting_until
    "at_in_flight_limit",
    "rate_limited",
    "failing",  # failed attempts in a row, not (yet) resting
    "ready",
)
# How the automatic disable begins its paused_reason (dispatch/store.sql, auto_disable).
AUTO_DISABLED_PREFIX = "disabled automatically"


@dataclasses.dataclass(frozen=True)
class EndpointState:
    name: str
    state: str  # one of ENDPOINT_STATES
    why: str | None  # in words, for a person; None when ready
    failures: int  # the failing streak: failed attempts since the last delivery
    failing_since: dt.datetime | None
    last_failure: str | None  # "HTTP 503", "Timeout": our words, never the receiver's
    resting_until: dt.datetime | None  # only while it rests
    in_flight: int  # counted only while max_in_flight is set
    queue: QueueStats  # due now, and the oldest due age


@dataclasses.dataclass(frozen=True)
class _Facts:
    """One row of ``endpoint_states``: what the claim reads for the endpoint."""

    name: str
    enabled: bool
    paused_reason: str | None
    archived_at: dt.datetime | None
    archived_reason: str | None
    rate_limit_per_s: float | None
    max_in_flight: int | None
    failures: int
    failing_since: dt.datetime | None
    last_failure: str | None
    resting_until: dt.datetime | None
    in_flight: int
    tokens: float | None


def endpoint_states(conn: Connection, figures: Queue | None = None) -> list[EndpointState]:
    """Every endpoint, by name, with its state and the queue due for it (``queue``:
    beside a large backlog, as of the queue's last full count; ``figures`` when the
    caller read them already)."""
    queues = (figures or queue(conn)).endpoints
    idle = QueueStats(0, 0.0)
    facts = [_Facts(**r) for r in conn.execute(_Q["endpoint_states"]).mappings()]
    return [_state(f, queues.get(f.name, idle)) for f in facts]


def _state(f: _Facts, queue: QueueStats) -> EndpointState:
    state, why = _decide(f)
    return EndpointState(
        name=f.name,
        state=state,
        why=why,
        failures=f.failures,
        failing_since=f.failing_since if f.failures else None,
        last_failure=f.last_failure if f.failures else None,
        resting_until=f.resting_until,
        in_flight=f.in_flight,
        queue=queue,
    )


def _decide(f: _Facts) -> tuple[str, str | None]:
    """The first state that holds, and why, in words."""
    if f.archived_at is not None:
        return "archived", f"archived: {f.archived_reason or 'retired by an operator'}"
    if not f.enabled:
        reason = f.paused_reason or "no reason recorded"
        if reason.startswith(AUTO_DISABLED_PREFIX):
            return "disabled", reason
        return "paused", f"paused: {reason}"
    if f.resting_until is not None:
        return (
            "resting",
            f"resting until {_at(f.resting_until)} (circuit breaker) after {_streak(f)}",
        )
    if f.max_in_flight is not None and f.in_flight >= f.max_in_flight:
        return "at_in_flight_limit", f"at its in-flight limit: {f.in_flight} of {f.max_in_flight}"
    if f.tokens is not None and f.tokens < 1.0:
        return "rate_limited", f"rate limited to {f.rate_limit_per_s:g}/s: no token left now"
    if f.failures:
        return "failing", _streak(f)
    return "ready", None


def _streak(f: _Facts) -> str:
    text = f"{f.failures} failed attempt{'s' if f.failures != 1 else ''} in a row"
    if f.failing_since is not None:
        text += f" since {_at(f.failing_since)}"
    if f.last_failure:
        text += f", the last: {f.last_failure}"
    return text


def _at(at: dt.datetime) -> str:
    """To the second, in UTC: what a person reads (the fields carry the exact instant)."""
    return f"{at.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
