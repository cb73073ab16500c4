"""Archiving an endpoint: no new effects accepted (a clear error naming it and the way
back), nothing sent for it by a real worker, its history kept; unarchive undoes it.
Real PostgreSQL, a real worker and a loopback receiver."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.console import lifecycle, operations
from spark_outbox.core import endpoints
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ArchivedEndpoint, Conflict
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.dispatcher.conftest import Receiver, run_worker
from tests.dispatcher.test_rotation import _hook
from tests.test_lifecycle_cli import _cli


def _enqueue(engine: Engine, n: str) -> str:
    key = effect_key("archive", n)
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint="hook", payload={"n": n})
    return key


def _states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT idempotency_key, state FROM effects"))
        return {r.idempotency_key: r.state for r in rows}


def test_an_archived_endpoint_refuses_new_effects_naming_itself_and_the_way_back(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _hook(engine, receiver.url())
    sent = _enqueue(engine, "before")
    assert run_worker(fast, engine) == 0
    with engine.begin() as conn:
        lifecycle.archive(conn, "hook", actor="olga", reason="receiver retired")
    with pytest.raises(ArchivedEndpoint) as refused:
        _enqueue(engine, "after")
    message = str(refused.value)
    assert refused.value.field == "endpoint" and "'hook' is archived" in message
    assert "outbox endpoints unarchive hook" in message
    assert _states(engine) == {sent: "delivered"}  # nothing written, history kept
    with engine.begin() as conn:
        ep = endpoints.get(conn, "hook")
        assert ep.archived_at is not None and not ep.enabled
        with pytest.raises(Conflict, match="unarchive"):
            operations.resume_endpoint(conn, "hook", actor="olga", reason="oops")
    with engine.begin() as conn:
        back = lifecycle.unarchive(conn, "hook", actor="olga", reason="receiver is back")
    assert back.enabled and back.archived_at is None and back.paused_reason is None
    again = _enqueue(engine, "after")
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [sent, again]


def test_archive_refuses_while_effects_are_pending_unless_told_to_cancel_them(
    engine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _hook(engine, "https://example.com/h")
    waiting = _enqueue(engine, "waiting")
    assert _cli(db_url, "endpoints", "archive", "hook", "--reason", "retired") == 2
    err = capsys.readouterr().err
    assert "'hook' has 1 pending effect(s)" in err and "--cancel-pending" in err
    assert _states(engine) == {waiting: "pending"}  # refused: nothing changed
    archive = ["endpoints", "archive", "hook", "--cancel-pending", "--reason", "retired"]
    assert _cli(db_url, *archive) == 0
    assert "1 pending effect(s) cancelled" in capsys.readouterr().out
    assert _states(engine) == {waiting: "cancelled"}
    with engine.connect() as conn:
        (details,) = conn.execute(
            sa.text("SELECT details FROM operator_actions WHERE action = 'archive_endpoint'")
        ).one()
    assert details == {
        "archived": {"old": False, "new": True},
        "enabled": {"old": True, "new": False},
        "cancelled_pending": 1,
    }


def test_a_worker_does_not_send_an_effect_that_reached_an_archived_endpoint(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    """An enqueue racing the archive (it read the endpoint unarchived) commits a pending
    effect for it: it waits, unsent, until the endpoint is unarchived."""
    _hook(engine, receiver.url())
    raced = _enqueue(engine, "raced")
    with engine.begin() as conn:  # the archive's steps, as if the count came first
        conn.execute(sa.text("UPDATE effects SET state = 'cancelled'"))
        lifecycle.archive(conn, "hook", actor="olga", reason="retired")
        conn.execute(sa.text("UPDATE effects SET state = 'pending'"))
    assert run_worker(fast, engine) == 0
    assert receiver.seen() == [] and _states(engine) == {raced: "pending"}
    with engine.begin() as conn:
        lifecycle.unarchive(conn, "hook", actor="olga", reason="back")
    assert run_worker(fast, engine) == 0
    assert receiver.keys() == [raced]


def test_unarchive_keeps_a_pause_made_before_the_archive(engine: Engine) -> None:
    _hook(engine, "https://example.com/h")
    with engine.begin() as conn:
        operations.pause_endpoint(conn, "hook", actor="o", reason="receiver broken")
        lifecycle.archive(conn, "hook", actor="o", reason="retired")
        with pytest.raises(Conflict, match="already archived"):
            lifecycle.archive(conn, "hook", actor="o", reason="twice")
    with engine.begin() as conn:
        back = lifecycle.unarchive(conn, "hook", actor="o", reason="back")
    assert (back.enabled, back.paused_reason) == (False, "receiver broken")


def test_the_cli_lists_an_archived_endpoint_as_archived_and_unarchives_it(
    engine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _hook(engine, "https://example.com/h")
    assert _cli(db_url, "endpoints", "archive", "hook", "--reason", "retired") == 0
    capsys.readouterr()
    assert _cli(db_url, "endpoints", "list") == 0
    assert capsys.readouterr().out.rstrip().endswith("archived")
    assert _cli(db_url, "endpoints", "unarchive", "hook", "--reason", "back") == 0
    assert capsys.readouterr().out.strip() == "unarchived hook: enabled"
