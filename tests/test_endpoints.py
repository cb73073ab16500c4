from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core import endpoints
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound


def test_webhook_gets_a_generated_standard_webhooks_secret(engine: Engine) -> None:
    with engine.begin() as conn:
        ep, secret = endpoints.add_webhook(conn, name="hook", url="https://example.com/h")
    assert secret.startswith("whsec_") and len(endpoints.secret_bytes(secret)) == 32
    assert ep.signing_secret == secret
    assert secret not in repr(ep)
    assert "signing_secret" not in ep.public() and ep.public()["has_signing_secret"] is True


def test_email_endpoint_hides_its_password(engine: Engine) -> None:
    with engine.begin() as conn:
        ep = endpoints.add_email(
            conn,
            name="mail",
            smtp_host="127.0.0.1",
            smtp_port=25,
            mail_from="billing@example.com",
            smtp_password="hunter2",
        )
    assert "hunter2" not in repr(ep) and "hunter2" not in str(ep.public())


def test_duplicate_names_conflict(engine: Engine) -> None:
    with engine.begin() as conn:
        endpoints.add_webhook(conn, name="hook", url="https://example.com/h")
    with pytest.raises(Conflict), engine.begin() as conn:
        endpoints.add_webhook(conn, name="hook", url="https://example.com/other")


@pytest.mark.parametrize("url", ["ftp://example.com", "example.com/h", "https://u:p@example.com/"])
def test_bad_webhook_urls_are_refused(engine: Engine, url: str) -> None:
    with pytest.raises(InvalidRequest) as info, engine.begin() as conn:
        endpoints.add_webhook(conn, name="hook", url=url)
    assert info.value.field == "url"


def test_pause_and_resume(engine: Engine) -> None:
    with engine.begin() as conn:
        endpoints.add_webhook(conn, name="hook", url="https://example.com/h")
        endpoints.pause(conn, "hook", "receiver down for maintenance")
        paused = endpoints.get(conn, "hook")
        endpoints.resume(conn, "hook")
        resumed = endpoints.get(conn, "hook")
    assert not paused.enabled and paused.paused_reason == "receiver down for maintenance"
    assert resumed.enabled and resumed.paused_reason is None


def test_unknown_endpoint_is_not_found(engine: Engine) -> None:
    with pytest.raises(NotFound), engine.begin() as conn:
        endpoints.pause(conn, "nope", "x")
