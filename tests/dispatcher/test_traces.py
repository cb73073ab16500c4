"""Traces of enqueue, the claim, each send and its record, exported to a real OTLP
receiver on loopback; the receivers continue them through ``traceparent``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core import tracing
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from spark_outbox.dispatch.traces import EffectTrace, Traces
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, Reply, run_worker
from tests.dispatcher.test_email import Inbox, _mail
from tests.otlp import OtlpReceiver


def _ids(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent, its format checked."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2)
    assert int(flags, 16) & 1  # sampled
    return trace_id, span_id


def _enqueue(engine: Engine, url: str, n: int = 1) -> list[str]:
    insert_endpoint(engine, "hook", url=url)
    keys = [effect_key("traced", i) for i in range(n)]
    with engine.begin() as conn:
        for key in keys:
            enqueue(conn, idempotency_key=key, endpoint="hook", payload={"k": key})
    return keys


def _column(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text(sql))]


def test_a_send_continues_the_trace_its_effect_was_enqueued_in(
    engine: Engine, fast: Settings, receiver: Receiver, otlp: OtlpReceiver
) -> None:
    with tracing.span("web.request") as request:
        (key,) = _enqueue(engine, receiver.url())
    assert run_worker(fast, engine) == 0

    (web,) = otlp.spans("web.request")
    (enq,) = otlp.spans("outbox.enqueue")
    (claim,) = otlp.spans("outbox.claim")
    (send,) = otlp.wait_for("outbox.send", 1)
    (rec,) = otlp.wait_for("outbox.record", 1)
    assert request is not None and enq.parent_span_id == web.span_id
    assert enq.attributes == {
        "outbox.idempotency_key": key,
        "outbox.endpoint": "hook",
        "outbox.new": True,
    }
    # The send is a child of the enqueue, in the web request's trace, linked to the claim.
    assert (send.trace_id, send.parent_span_id) == (web.trace_id, enq.span_id)
    assert send.links == ((claim.trace_id, claim.span_id),)
    assert claim.trace_id != web.trace_id and claim.attributes["outbox.claim.effects"] == 1
    assert send.kind == 3  # CLIENT
    attrs = send.attributes
    assert (attrs["outbox.endpoint"], attrs["outbox.idempotency_key"]) == ("hook", key)
    assert (attrs["outbox.attempt"], attrs["outbox.outcome"]) == (1, "delivered")
    assert attrs["http.response.status_code"] == 200 and attrs["outbox.duration_ms"] > 0
    # The record statement is a span of its own, linked to the sends it recorded.
    assert rec.links == ((web.trace_id, send.span_id),) and rec.parent_span_id == ""
    assert rec.attributes == {"outbox.worker_id": "test-worker", "outbox.records": 1}
    # The receiver continues the send span; the attempt's row names the same span.
    (seen,) = receiver.seen()
    assert _ids(seen.headers["traceparent"]) == (web.trace_id, send.span_id)
    assert "tracestate" not in seen.headers
    assert _column(engine, "SELECT trace_parent FROM delivery_attempts") == [
        seen.headers["traceparent"]
    ]


def test_every_attempt_is_its_own_send_span_in_the_effects_trace(
    engine: Engine, fast: Settings, receiver: Receiver, otlp: OtlpReceiver
) -> None:
    receiver.script("/hook", Reply(503), Reply(200))
    _enqueue(engine, receiver.url())  # no span around it: enqueue's is the root
    assert run_worker(fast, engine) == 0
    (enq,) = otlp.spans("outbox.enqueue")
    sends = sorted(otlp.wait_for("outbox.send", 2), key=lambda s: s.attributes["outbox.attempt"])
    assert [s.attributes["outbox.outcome"] for s in sends] == ["retry", "delivered"]
    assert [s.attributes["http.response.status_code"] for s in sends] == [503, 200]
    assert {(s.trace_id, s.parent_span_id) for s in sends} == {(enq.trace_id, enq.span_id)}
    parents = [r.headers["traceparent"] for r in receiver.seen()]
    assert [_ids(p) for p in parents] == [(enq.trace_id, s.span_id) for s in sends]
    rows = _column(engine, "SELECT trace_parent FROM delivery_attempts ORDER BY attempt")
    assert rows == parents


@pytest.fixture
def mailbox() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def test_every_send_is_linked_from_the_record_that_recorded_it_at_most_128_a_span(
    engine: Engine, fast: Settings, receiver: Receiver, otlp: OtlpReceiver
) -> None:
    _enqueue(engine, receiver.url(), n=300)
    assert run_worker(fast, engine) == 0
    sends = otlp.wait_for("outbox.send", 300)
    records = otlp.spans("outbox.record")
    linked = [link for r in records for link in r.links]
    assert sorted(linked) == sorted((s.trace_id, s.span_id) for s in sends)
    assert max(len(r.links) for r in records) <= 128
    assert len({s.trace_id for s in sends}) == 300  # each effect enqueued in its own trace


def test_an_email_carries_its_send_span_in_a_header_of_its_own(
    engine: Engine, fast: Settings, mailbox: tuple[Inbox, int], otlp: OtlpReceiver
) -> None:
    inbox, port = mailbox
    _mail(engine, port, ("ann@example.com", {"subject": "Invoice 7", "text": "Hi"}))
    assert run_worker(fast, engine) == 0
    (send,) = otlp.wait_for("outbox.send", 1)
    (msg,) = inbox.messages
    assert _ids(msg["Outbox-Traceparent"]) == (send.trace_id, send.span_id)
    assert msg["traceparent"] is None or msg["traceparent"] == msg["Outbox-Traceparent"]
    assert send.attributes["outbox.channel"] == "email"


def test_a_malformed_stored_trace_context_starts_a_new_trace_and_the_effect_is_delivered(
    engine: Engine, fast: Settings, receiver: Receiver, otlp: OtlpReceiver
) -> None:
    _enqueue(engine, receiver.url())
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE effects SET trace_parent = :parent, trace_state = :state"),
            {"parent": "00-x\r\nEvil: 1", "state": "a=\x01\r\nEvil: 2"},
        )
    assert run_worker(fast, engine) == 0
    (send,) = otlp.wait_for("outbox.send", 1)
    assert send.parent_span_id == "" and send.attributes["outbox.outcome"] == "delivered"
    (seen,) = receiver.seen()
    assert _ids(seen.headers["traceparent"]) == (send.trace_id, send.span_id)
    assert "evil" not in seen.headers


def test_with_tracing_off_nothing_is_stored_nor_sent(
    engine: Engine, fast: Settings, receiver: Receiver, untraced: None
) -> None:
    _enqueue(engine, receiver.url())
    assert run_worker(fast, engine) == 0
    (seen,) = receiver.seen()
    assert "traceparent" not in seen.headers
    assert _column(engine, "SELECT trace_parent FROM effects") == [None]
    assert _column(engine, "SELECT trace_parent FROM delivery_attempts") == [None]


def test_with_tracing_off_no_opentelemetry_module_is_loaded() -> None:
    """Off costs nothing: the sink, enqueue and the worker import none of it."""
    code = (
        "import sys\n"
        "import spark_outbox.core.enqueue, spark_outbox.dispatch.worker, spark_outbox.spark.sink\n"
        "from spark_outbox.core import tracing\n"
        "assert tracing.tracer() is None\n"
        "with tracing.span('x') as s: assert s is None\n"
        "assert tracing.current() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_tracing_asked_for_without_the_otel_extra_runs_untraced_and_says_which_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as in a core install: not importable\n"
        "from spark_outbox.core import tracing\n"
        "assert tracing.tracer() is None\n"
        "with tracing.span('x') as s: assert s is None\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'spark-outbox[otel]'" in done.stderr


def test_the_standard_variables_decide_whether_tracing_is_on() -> None:
    endpoint = "http://127.0.0.1:4318"
    cases = [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint + "/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ]
    assert [tracing.enabled_by(env) for env, _ in cases] == [on for _, on in cases]


def test_a_trace_id_is_read_only_from_a_valid_traceparent() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.trace_id(good) == "4bf92f3577b34da6a3ce929d0e0e4736"
    bad = [None, "", "garbage", good.upper(), "00-" + "0" * 32 + "-00f067aa0ba902b7-01"]
    assert [tracing.trace_id(t) for t in bad] == [None] * len(bad)


_HEX = "0123456789abcdef"
_VALID = st.builds(
    lambda t, s, f: f"00-{t}-{s}-{f:02x}",
    st.text(_HEX, min_size=32, max_size=32).filter(lambda t: set(t) != {"0"}),
    st.text(_HEX, min_size=16, max_size=16).filter(lambda s: set(s) != {"0"}),
    st.integers(0, 255),
)


@settings(max_examples=300, deadline=None)
@given(
    parent=st.one_of(_VALID, st.text(max_size=80)),
    state=st.one_of(st.none(), st.text(max_size=80), st.just("vendor=abc,other=x1")),
)
def test_any_stored_trace_context_gives_a_well_formed_traceparent_continuing_a_valid_one(
    parent: str, state: str | None
) -> None:
    """Stored contexts are outside data (a producer's, or hand-written): whatever
    they hold, a send's headers are one valid W3C traceparent (and a tracestate
    without line breaks), continuing the stored trace exactly when it is valid."""
    from opentelemetry.sdk.trace import TracerProvider

    traces = Traces(TracerProvider().get_tracer("test"), "w")
    effect = store.Claimed(1, "k" * 64, "hook", None, "{}", 1, "token")
    effect.trace = EffectTrace(tracing.Carrier(parent, state), None)
    span = traces.send_started(effect, "webhook")
    span.end()
    headers = effect.trace.headers
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", headers["traceparent"])
    trace_id = headers["traceparent"][3:35]
    if parent[-2:] == "01" and continued(parent):  # a sampled parent: the send is too
        assert int(headers["traceparent"][-2:], 16) & 1
    assert set(headers) <= {"traceparent", "tracestate"}
    assert "\r" not in headers.get("tracestate", "") and "\n" not in headers.get("tracestate", "")
    assert (trace_id == parent[3:35]) == continued(parent)


def continued(parent: str) -> bool:
    """Whether a stored traceparent is one a send continues: W3C version 00, ids
    not all zero (the propagator's rules)."""
    return re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", parent) is not None and (
        set(parent[3:35]) != {"0"} and set(parent[36:52]) != {"0"}
    )
