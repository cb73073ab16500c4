"""A real OTLP/HTTP receiver on loopback: what a collector gets, decoded.

It accepts ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` in protobuf
(gzip or not), the protocol the SDK's exporter speaks to a collector, decodes
it with ``opentelemetry-proto`` and keeps every span. ``traced`` points the
process's tracing at it (the standard ``OTEL_*`` variables) for one test.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from spark_outbox.core import tracing


@dataclasses.dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each linked span
    start_ns: int
    end_ns: int
    service: str


class OtlpReceiver:
    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(body)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        taken = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                taken += [_span(s, service) for s in scope_spans.spans]
        with self._lock:
            self.requests += 1
            self._spans += taken

    def spans(self, name: str | None = None) -> list[Span]:
        tracing.flush()  # what the process buffered is here when flush returns
        with self._lock:
            return [s for s in self._spans if name is None or s.name == name]

    def wait_for(self, name: str, count: int, timeout_s: float = 10.0) -> list[Span]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.spans(name)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return found

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _attributes(pairs: Any) -> dict[str, Any]:
    found = {}
    for kv in pairs:
        which = kv.value.WhichOneof("value")
        found[kv.key] = getattr(kv.value, which) if which else None
    return found


def _span(s: Any, service: str) -> Span:
    return Span(
        name=s.name,
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_span_id=s.parent_span_id.hex(),
        kind=s.kind,
        attributes=_attributes(s.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
        start_ns=s.start_time_unix_nano,
        end_ns=s.end_time_unix_nano,
        service=service,
    )


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on for this test, exported to a receiver on loopback; off after it."""
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "outbox-tests")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # ms: tests need not wait 5 s
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    tracing.reset()
    try:
        yield receiver
    finally:
        tracing.reset()
        receiver.close()


@pytest.fixture
def untraced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tracing off whatever the environment of the test run says."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    tracing.reset()
    try:
        yield
    finally:
        tracing.reset()
