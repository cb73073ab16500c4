"""The support page shows each attempt's trace id, and links it to the operator's
trace viewer; the API returns it too. The attempts come from a real, traced
dispatcher run whose spans a real OTLP receiver got."""

from __future__ import annotations

import dataclasses
import html

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.api.conftest import Tokens
from tests.api.test_ui import _sign_in
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, Reply, run_worker
from tests.otlp import OtlpReceiver

VIEWER = 'https://grafana.example.com/explore?left={"queries":[{"query":"{trace_id}"}]}&s={span_id}'


def _traced_attempts(engine: Engine, settings: Settings, receiver: Receiver) -> str:
    """Two attempts (503, then 200) of one effect, sent by a traced dispatcher."""
    insert_endpoint(engine, "hook", url=receiver.url())
    receiver.script("/hook", Reply(503), Reply(200))
    key = effect_key("traced", 1)
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint="hook", payload={"n": 1})
    fast = dataclasses.replace(settings, poll_interval_s=0.1, retry_schedule_s=(0.0, 0.1))
    assert run_worker(fast, engine) == 0
    return key


def test_each_attempt_shows_its_trace_id_linked_to_the_configured_viewer(
    engine: Engine,
    api_settings: Settings,
    api_tokens: Tokens,
    receiver: Receiver,
    otlp: OtlpReceiver,
) -> None:
    key = _traced_attempts(engine, api_settings, receiver)
    sends = sorted(otlp.wait_for("outbox.send", 2), key=lambda s: s.attributes["outbox.attempt"])
    assert len(sends) == 2
    settings = dataclasses.replace(api_settings, trace_url_template=VIEWER)
    with TestClient(create_app(settings), base_url="https://testserver") as client:
        _sign_in(client, api_tokens.support)
        page = html.unescape(client.get(f"/ui/effects/{key}").text)
        api = client.get(
            f"/v1/effects/{key}", headers={"Authorization": f"Bearer {api_tokens.support}"}
        )
    for send in sends:
        link = VIEWER.replace("{trace_id}", send.trace_id).replace("{span_id}", send.span_id)
        assert f'href="{link}"' in page
    assert page.count(f">{sends[0].trace_id}</a>") == 2  # both attempts: one trace
    assert [a["trace_id"] for a in api.json()["attempts"]] == [s.trace_id for s in sends]


def test_without_a_viewer_the_trace_id_is_shown_unlinked(
    engine: Engine,
    api_settings: Settings,
    api_tokens: Tokens,
    receiver: Receiver,
    otlp: OtlpReceiver,
) -> None:
    key = _traced_attempts(engine, api_settings, receiver)
    (trace_id,) = {s.trace_id for s in otlp.wait_for("outbox.send", 2)}
    with TestClient(create_app(api_settings), base_url="https://testserver") as client:
        _sign_in(client, api_tokens.support)
        page = client.get(f"/ui/effects/{key}").text
    assert page.count(f'<code class="trace">{trace_id}</code>') == 2
    assert 'class="trace" href' not in page


@pytest.mark.parametrize(
    "template",
    ["javascript:alert(1)//{trace_id}", "https://jaeger.example.com/trace/", "/trace/{trace_id}"],
)
def test_a_viewer_template_that_is_not_an_http_url_naming_the_trace_is_refused(
    template: str,
) -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_TRACE_URL_TEMPLATE"):
        Settings.from_env({"OUTBOX_TRACE_URL_TEMPLATE": template})
