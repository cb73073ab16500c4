from __future__ import annotations

import datetime as dt
import select

import psycopg2
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import InvalidEffect, UnknownEndpoint
from spark_outbox.core.keys import effect_key
from spark_outbox.core.validation import MAX_PAYLOAD_BYTES
from tests.conftest import insert_billing_endpoints, insert_endpoint

KEY = effect_key("order.created", "order-1")


@pytest.fixture
def hook(engine: Engine) -> str:
    insert_endpoint(engine, "orders-webhook")
    return "orders-webhook"


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM effects")).scalar_one())


def test_enqueue_writes_one_pending_effect(engine: Engine, hook: str) -> None:
    with engine.begin() as conn:
        result = enqueue(
            conn,
            idempotency_key=KEY,
            endpoint=hook,
            payload={"order": 1},
            recipient="a@example.com",
            ordering_key="order-1",
        )
    assert result.new and not result.payload_mismatch
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM effects")).mappings().one()
    assert row["idempotency_key"] == KEY
    assert row["state"] == "pending"
    assert row["payload"] == {"order": 1}
    assert row["recipient"] == "a@example.com"
    assert row["job"] is None and row["batch_id"] is None


def test_enqueue_is_idempotent_on_the_key(engine: Engine, hook: str) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={"order": 1})
    with engine.begin() as conn:
        again = enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={"order": 1})
    assert not again.new and not again.payload_mismatch
    assert _count(engine) == 1


def test_same_key_with_another_payload_is_flagged_and_not_stored(engine: Engine, hook: str) -> None:
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={"order": 1})
    with engine.begin() as conn:
        again = enqueue(conn, idempotency_key=KEY, endpoint=hook, payload='{"order": 2}')
    assert not again.new and again.payload_mismatch
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT payload FROM effects")).scalar_one() == {"order": 1}


def test_rolled_back_transaction_enqueues_nothing(engine: Engine, hook: str) -> None:
    with engine.connect() as conn:
        trans = conn.begin()
        enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={"order": 1})
        trans.rollback()
    assert _count(engine) == 0


def test_a_key_in_the_ledger_is_never_enqueued_again(engine: Engine, hook: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at) "
                "VALUES (:k, :e, 'x', now())"
            ),
            {"k": KEY, "e": hook},
        )
    with engine.begin() as conn:
        result = enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={"order": 1})
    assert not result.new
    assert _count(engine) == 0


def test_not_before_delays_the_first_attempt(engine: Engine, hook: str) -> None:
    later = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={}, not_before=later)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT next_attempt_at FROM effects")).scalar_one() == later


def test_commit_notifies_dispatchers(engine: Engine, db_url: str, hook: str) -> None:
    listener = psycopg2.connect(db.libpq_url(db_url))
    listener.autocommit = True
    try:
        listener.cursor().execute("LISTEN outbox_effects")
        with engine.begin() as conn:
            enqueue(conn, idempotency_key=KEY, endpoint=hook, payload={})
        ready, _, _ = select.select([listener], [], [], 5)
        assert ready, "no NOTIFY arrived within 5 s"
        listener.poll()
        assert [n.channel for n in listener.notifies] == ["outbox_effects"]
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"idempotency_key": "abc"}, "idempotency_key", "effect_key"),
        ({"idempotency_key": KEY.upper()}, "idempotency_key", "effect_key"),
        ({"endpoint": ""}, "endpoint", "registered endpoint"),
        ({"payload": [1, 2]}, "payload", "wrap the value"),
        ({"payload": "not json"}, "payload", "JSON object"),
        ({"payload": {"x": "y" * MAX_PAYLOAD_BYTES}}, "payload", "reference"),
        ({"payload": {"x": "nul\x00"}}, "payload", "NUL"),
        ({"payload": {"x": float("nan")}}, "payload", "numbers"),
        ({"recipient": 42}, "recipient", "string"),
        ({"not_before": dt.datetime(2030, 1, 1)}, "not_before", "timezone-aware"),
    ],
)
def test_bad_input_names_the_field_and_the_fix_and_writes_nothing(
    engine: Engine, hook: str, kwargs: dict[str, object], field: str, fix: str
) -> None:
    args: dict[str, object] = {"idempotency_key": KEY, "endpoint": hook, "payload": {"ok": True}}
    args.update(kwargs)
    with pytest.raises(InvalidEffect) as info, engine.begin() as conn:
        enqueue(conn, **args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert fix in str(info.value)
    assert _count(engine) == 0


def test_unknown_endpoint_is_refused(engine: Engine, hook: str) -> None:
    with pytest.raises(UnknownEndpoint, match="outbox endpoints add"), engine.begin() as conn:
        enqueue(conn, idempotency_key=KEY, endpoint="nope", payload={})
    assert _count(engine) == 0


@pytest.fixture
def mail(engine: Engine) -> str:
    insert_billing_endpoints(engine)
    return "billing-email"


EMAIL_CASES = [
    (None, {"subject": "Your order", "text": "Thanks"}, "recipient"),
    ("ada@example.com, eve@example.com", {"subject": "s", "text": "t"}, "recipient"),
    ("ada@example.com", {"text": "Thanks"}, "payload.subject"),
    ("ada@example.com", {"subject": "s", "body": "Thanks"}, "payload.text"),
    ("ada@example.com", '{"subject": "s", "text": "t", "html": 1}', "payload.html"),
]


def test_an_email_effect_is_checked_against_the_email_contract_up_front(
    engine: Engine, mail: str
) -> None:
    for recipient, payload, field in EMAIL_CASES:
        with pytest.raises(InvalidEffect) as info, engine.begin() as conn:
            enqueue(conn, idempotency_key=KEY, endpoint=mail, payload=payload, recipient=recipient)  # type: ignore[arg-type]
        assert (info.value.field, bool(info.value.fix)) == (field, True)
    assert _count(engine) == 0


def test_a_good_email_effect_is_enqueued_and_webhooks_take_any_object(
    engine: Engine, mail: str, hook: str
) -> None:
    with engine.begin() as conn:
        email = enqueue(
            conn,
            idempotency_key=KEY,
            endpoint=mail,
            payload={"subject": "Your order", "text": "Thanks", "html": "<p>Thanks</p>"},
            recipient="ada@example.com",
        )
        hook_key = effect_key("order.created", "order-2")
        webhook = enqueue(conn, idempotency_key=hook_key, endpoint=hook, payload={"any": [1]})
    assert email.new and webhook.new and _count(engine) == 2
