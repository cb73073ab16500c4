"""A write through the API is committed before its answer leaves: a client that gets
200 (or the support page's redirect) and reads at once sees the change, and a commit
that fails is never answered as done. A real server (``outbox api serve``) and a
commit made slow on purpose (a deferred constraint trigger sleeping at COMMIT)."""

from __future__ import annotations

import time

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.api.conftest import Served, Tokens

SLOW_COMMIT_S = 1.0


def _at_commit(engine: Engine, name: str, body: str) -> None:
    """Run ``body`` (plpgsql) at the COMMIT of every transaction that logs an
    operator action: a deferred constraint trigger on operator_actions."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN {body}; RETURN NULL; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER INSERT ON operator_actions "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
        )


def _paused(engine: Engine, name: str) -> bool:
    with engine.connect() as conn:
        enabled = conn.execute(
            sa.text("SELECT enabled FROM endpoints WHERE name = :n"), {"n": name}
        ).scalar_one()
    return not enabled


def test_an_api_write_is_committed_before_its_answer_is_sent(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    _at_commit(engine, "test_slow_commit", f"PERFORM pg_sleep({SLOW_COMMIT_S})")
    t0 = time.monotonic()
    done = httpx.post(
        f"{served.url}/v1/endpoints/billing-webhook/pause",
        json={"reason": "receiver down, ticket 12"},
        headers=api_tokens.auth("operator"),
        timeout=30,
    )
    took_s = time.monotonic() - t0
    assert done.status_code == 200, done.text
    # Read at once, from another connection: the answer came after the commit.
    assert _paused(engine, "billing-webhook"), f"answered in {took_s:.2f} s, before the commit"
    assert took_s >= SLOW_COMMIT_S


def test_a_write_whose_commit_fails_is_never_answered_as_done(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    _at_commit(engine, "test_failed_commit", "RAISE EXCEPTION 'refused at commit (a test)'")
    answer = httpx.post(
        f"{served.url}/v1/endpoints/billing-webhook/pause",
        json={"reason": "receiver down, ticket 12"},
        headers=api_tokens.auth("operator"),
        timeout=30,
    )
    assert answer.status_code >= 500, answer.text
    assert not _paused(engine, "billing-webhook")
