"""The dispatcher's spans: the claim, each send, each record (tracing on only).

The worker makes a ``Traces`` only when ``spark_outbox.core.tracing.tracer()`` is
not None; off, nothing here runs and the claim, the sends and the record are
exactly what they are without tracing (docs/operations.md, "Observability").

Why a send is a CHILD of the span that created its effect, not a link: the
receiver must continue the batch's trace (its ``traceparent`` names it), and an
operator looking at a batch's trace should find every attempt of its effects
there, hours later too; a span may start after its parent ended. The claim
leases effects of many traces at once, so it is a trace of its own that every
send links to. Each record is a child of its send, timed by the one statement
that recorded the whole batch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.core import tracing
from spark_outbox.dispatch import store


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
            created = store.trace_contexts(engine, [e.id for e in claim.effects])
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
            link = tracing.link_to(tracing.carrier(span))
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
            context=tracing.context_of(trace.created_in),
            kind=_client_kind(),
            links=[trace.claim_link] if trace.claim_link is not None else (),
            attributes={
                "outbox.endpoint": effect.endpoint,
                "outbox.idempotency_key": effect.idempotency_key,
                "outbox.attempt": effect.attempt,
                "outbox.channel": channel,
                "outbox.worker_id": self._worker_id,
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
        """One ``outbox.record`` span per attempt, child of its send, timed by the
        statement that recorded the batch (from ``t0``, ns since the epoch)."""
        ended_ns = time.time_ns()
        for r in results:
            if r.trace_parent is None:
                continue
            ok = fresh is not None and fresh.get((r.effect_id, r.lease_token), False)
            span = self._tracer.start_span(
                "outbox.record",
                context=tracing.context_of(tracing.Carrier(r.trace_parent)),
                start_time=t0,
                attributes={
                    "outbox.idempotency_key": r.idempotency_key,
                    "outbox.outcome": r.outcome if ok else "stale",
                    "outbox.record.batch_size": len(results),
                },
            )
            span.end(end_time=ended_ns)


def _client_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT


def _error_status() -> Any:
    from opentelemetry.trace import StatusCode

    return StatusCode.ERROR
