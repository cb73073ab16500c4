"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables turn them on.

Off (the default) costs nothing: ``tracer()`` answers None, no ``opentelemetry``
module is imported, and every hook in the sink, ``enqueue`` and the dispatcher is
one ``is None`` test. On when ``OTEL_SDK_DISABLED`` is not true and either
``OTEL_TRACES_EXPORTER`` names ``otlp`` (or ``console``), or it is unset and an
OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). Spans then go over OTLP/HTTP (protobuf)
through a batching processor; every other ``OTEL_*`` setting (service name,
resource attributes, sampler, headers, timeouts) is the SDK's own. A process
that installed its own ``TracerProvider`` (a web app calling ``enqueue``, a Spark
job) has its spans made with it instead: nothing is configured here then.

An effect's trace context travels as a ``Carrier``: the W3C ``traceparent`` and
``tracestate`` texts (stored on the effect or its batch, sent to receivers).
The helpers here are shared by the sink, ``enqueue`` and the dispatcher (the
``otel`` extra installs the SDK; docs/operations.md, "Observability").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

log = logging.getLogger(__name__)
NAME = "spark_outbox"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_UNSET: Any = object()
_lock = threading.Lock()
_tracer: Any = _UNSET  # None (off), or the tracer spans are made with
_provider: Any = None  # ours, when we configured one (flushed and shut down here)
_service = NAME  # service.name when OTEL_SERVICE_NAME does not say (serve_as)


class Carrier(NamedTuple):
    """A span's W3C trace context, as stored and as sent."""

    traceparent: str
    tracestate: str | None = None


def enabled_by(environ: Mapping[str, str]) -> bool:
    """Whether these variables turn our own exporting on (the rules above)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if exporters & {"otlp", "console"}:
        return True
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return exporters <= {""} and bool(endpoint)


def serve_as(service_name: str) -> None:
    """The ``service.name`` this process's spans carry unless ``OTEL_SERVICE_NAME``
    (or ``OTEL_RESOURCE_ATTRIBUTES``) names one: set by an entry point (the
    dispatcher, a Spark job) before its first span."""
    global _service
    _service = service_name


def tracer() -> Any:
    """The tracer to make spans with, or None: tracing is off. Decided once a process."""
    global _tracer
    if _tracer is _UNSET:
        with _lock:
            if _tracer is _UNSET:
                _tracer = _decide(os.environ)
    return _tracer


def _decide(environ: Mapping[str, str]) -> Any:
    global _provider
    if "opentelemetry.trace" in sys.modules:  # the host may have its own provider
        from opentelemetry import trace

        host = trace.get_tracer_provider()
        if type(host).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider"):
            return host.get_tracer(NAME)
    if not enabled_by(environ):
        return None
    try:
        _provider = _new_provider(environ)
    except ImportError as exc:  # asked for, not installed: run untraced, say so once
        log.warning(
            "OTEL_* variables turn tracing on but the otel extra is not installed (%s); "
            "running without traces: pip install 'spark-outbox[otel]'",
            exc.name,
            extra={"event": "tracing.unavailable"},
        )
        return None
    return _provider.get_tracer(NAME)


def _new_provider(environ: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: _service}))
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "console" in exporters:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if "otlp" in exporters or exporters <= {""}:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def flush(timeout_s: float = 10.0) -> None:
    """Export what is buffered now (the end of a batch, a dispatcher's stop)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def reset() -> None:
    """Forget the decision and shut our exporter down: the variables are read again
    at the next ``tracer()`` (tests, and a process that changes them)."""
    global _tracer, _provider
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _tracer, _provider = _UNSET, None


def carrier(span: Any) -> Carrier | None:
    """The span's context as W3C texts; None for an invalid (not sampled in) span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    state = context.trace_state.to_header() if context.trace_state else None
    return Carrier(parent, state or None)


def current() -> Carrier | None:
    """The caller's current span, if the caller traces (opentelemetry already loaded)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    return carrier(trace.get_current_span())


def context_of(stored: Carrier | None) -> Any:
    """A parent context from stored texts; a malformed one gives a new trace (None)."""
    if stored is None or not stored.traceparent:
        return None
    return _extracted(stored.traceparent, stored.tracestate)


@functools.lru_cache(maxsize=4096)
def _extracted(traceparent: str, tracestate: str | None) -> Any:
    """Parsed once per context: a batch's effects share theirs (contexts are immutable)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    headers = {"traceparent": traceparent}
    if tracestate:
        headers["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(headers) or None


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    links: Sequence[Any] = (),
) -> Iterator[Any]:
    """A span of the current context made current inside; yields None when tracing
    is off (the body then runs as it would without it)."""
    made_by = tracer()
    if made_by is None:
        yield None
        return
    with made_by.start_as_current_span(name, attributes=attributes, links=links) as opened:
        yield opened


def trace_id(traceparent: str | None) -> str | None:
    """The trace id in a stored ``traceparent`` (None if it holds none): the
    support page shows it without loading OpenTelemetry."""
    found = _TRACEPARENT.match(traceparent or "")
    if found is None or set(found.group(1)) == {"0"}:
        return None
    return found.group(1)


def viewer_url(template: str, traceparent: str | None) -> str | None:
    """A trace viewer's page for this span: the operator's template with
    ``{trace_id}`` (and ``{span_id}``) filled in; None without a template or an id.
    Replaced as text, not ``str.format``: viewers' URLs hold braces of their own."""
    tid = trace_id(traceparent)
    if not template or tid is None or traceparent is None:
        return None
    return template.replace("{trace_id}", tid).replace("{span_id}", traceparent[36:52])
