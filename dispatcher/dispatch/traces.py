"""The dispatcher's spans: the claim, each send, each record (tracing on only).

The worker makes a ``Traces`` only when ``spark_outbox.core.tracing.tracer()`` is
not None; off, nothing here runs and the claim, the sends and the record are
exactly what they are without tracing (docs/operations.md, "Observability").

Why a send is a CHILD of the span that created its effect, not a link: the
receiver must continue the batch's trace (its ``traceparent`` names it), and an
operator looking at a batch's trace should find every attempt of its effects
there, hours later too; a span may start after its parent ended. The claim
leases effects of many traces at once, so it is a trace of its own that every
send links to. The record is one statement for a batch of attempts of many
traces too: one ``outbox.record`` span per statement (per ``LINKS_PER_SPAN``
attempts), linked to the sends it recorded. A span per attempt and per record
cost twice the CPU of a span per attempt alone (bench/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.core import outside, tracing
from spark_outbox.dispatch import store

log = logging.getLogger(__name__)
# OpenTelemetry keeps at most 128 links a span by default (OTEL_SPAN_LINK_COUNT_LIMIT).
LINKS_PER_SPAN = 128


@dataclasses.dataclass(slots=True)
class EffectTrace:
    """One claimed effect's tracing: what it was created in, the claim's span, and
    (once its send span starts) the headers the channel sends."""

    created_in: tracing.Carrier | None
    claim_link: Any
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


class Traces:
    def __init__(self, tracer: Any, worker_id: str) -> None:
        self._tracer = tracer
        self._worker_id = worker_id

    def claim(self, inner: Callable[..., store.Claim]) -> Callable[..., store.Claim]:
        """``inner`` (``Statements.claim``) with a span, and the claimed effects'
        trace contexts read in one statement (an empty claim makes no span)."""

        def traced(engine: Engine, worker_id: str, room: int, lease_s: float) -> store.Claim:
            started_ns = time.time_ns()
            claim = inner(engine, worker_id, room, lease_s)
            if not claim.effects:
                return claim
            created = _created_in(engine, claim.effects)
            span = self._tracer.start_span(
                "outbox.claim",
                start_time=started_ns,
                attributes={
                    "outbox.worker_id": worker_id,
                    "outbox.claim.limit": room,
                    "outbox.claim.effects": len(claim.effects),
                },
            )
            span.end()
            link = _link(span.get_span_context())
            for effect in claim.effects:
                effect.trace = EffectTrace(created.get(effect.id), link)
            return claim

        return traced

    def send_started(self, effect: store.Claimed, channel: str) -> Any:
        """The attempt's span, under the effect's creating context; its W3C context
        becomes the headers the channel sends."""
        trace: EffectTrace | None = effect.trace
        if trace is None:  # claimed before tracing began (cannot happen) or handed in
            trace = effect.trace = EffectTrace(None, None)
        span = self._tracer.start_span(
            "outbox.send",
            context=tracing.context_of(trace.created_in) or _new_trace(),
            kind=_client_kind(),
            links=[trace.claim_link] if trace.claim_link is not None else (),
            attributes={
                "outbox.endpoint": effect.endpoint,
                "outbox.idempotency_key": effect.idempotency_key,
                "outbox.attempt": effect.attempt,
                "outbox.channel": channel,
            },
        )
        sent_as = tracing.carrier(span)
        if sent_as is not None:
            trace.headers = {"traceparent": sent_as.traceparent}
            if sent_as.tracestate:
                trace.headers["tracestate"] = sent_as.tracestate
        return span

    def send_ended(self, span: Any, result: store.Result) -> None:
        """The outcome on the span; the span's context on the result (the attempt's row)."""
        span.set_attribute("outbox.outcome", result.outcome)
        span.set_attribute("outbox.duration_ms", result.duration_ms)
        if result.status_code is not None:
            span.set_attribute("http.response.status_code", result.status_code)
        if result.error_class:
            span.set_attribute("error.type", result.error_class)
        if result.outcome != "delivered":
            span.set_status(_error_status(), result.outcome)
        sent_as = tracing.carrier(span)
        result.trace_parent = sent_as.traceparent if sent_as is not None else None
        span.end()

    def recorded(
        self, results: Sequence[store.Result], fresh: Mapping[tuple[int, str], bool] | None, t0: int
    ) -> None:
        """The record statement's span (from ``t0``, ns since the epoch), linked to
        the sends it recorded, each link with the outcome recorded (``stale``: the
        lease had been lost); one span per ``LINKS_PER_SPAN`` sends."""
        from opentelemetry.trace import Link

        ended_ns = time.time_ns()
        traced = [r for r in results if r.trace_parent is not None]
        for first in range(0, len(traced), LINKS_PER_SPAN):
            chunk = traced[first : first + LINKS_PER_SPAN]
            links = [
                Link(
                    _span_context(r.trace_parent or ""),
                    {"outbox.outcome": r.outcome if fresh and fresh.get(_lease(r)) else "stale"},
                )
                for r in chunk
            ]
            span = self._tracer.start_span(
                "outbox.record",
                start_time=t0,
                links=links,
                attributes={"outbox.worker_id": self._worker_id, "outbox.records": len(results)},
            )
            span.end(end_time=ended_ns)


def _created_in(engine: Engine, effects: Sequence[store.Claimed]) -> dict[int, tracing.Carrier]:
    """The effects' trace contexts; none if they cannot be read now. The claim has
    committed: failing (and being retried) here would strand its leases until they
    expire, for a trace: its sends start new traces instead."""
    try:
        return store.trace_contexts(engine, [e.id for e in effects])
    except Exception as exc:  # the claim's leases matter more than a trace
        log.warning(
            "trace contexts not read; these sends start new traces",
            extra={"event": "tracing.contexts_unread", "effects": len(effects)}
            | outside.failure(exc),
        )
        return {}


def _new_trace() -> Any:
    """An empty context: a send without a stored one starts a trace, whatever is current."""
    from opentelemetry.context import Context

    return Context()


def _link(context: Any) -> Any:
    from opentelemetry.trace import Link

    return Link(context)


def _lease(r: store.Result) -> tuple[int, str]:
    return (r.effect_id, r.lease_token)


def _span_context(traceparent: str) -> Any:
    """The send span's context from the traceparent ``send_ended`` wrote (well formed:
    ours), without a propagator's parse."""
    from opentelemetry.trace import SpanContext, TraceFlags

    flags = TraceFlags(int(traceparent[53:55], 16))
    return SpanContext(int(traceparent[3:35], 16), int(traceparent[36:52], 16), False, flags)


def _client_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT


def _error_status() -> Any:
    from opentelemetry.trace import StatusCode

    return StatusCode.ERROR
