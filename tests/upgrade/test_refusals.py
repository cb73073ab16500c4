"""This release on the previous release's schema: before ``outbox db upgrade``, its
dispatcher, API, Spark sink and ``outbox verify`` refuse in one line that names both
revisions and the fix, exit non-zero, and change nothing in the database."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, revisions
from tests.upgrade import previous
from tests.upgrade.conftest import new_outbox, run

OLD = previous.recorded().revision


@pytest.fixture
def old_engine(old_schema_url: str) -> Iterator[Engine]:
    """The previous release's schema holding an endpoint and a pending effect: work a
    dispatcher that started would claim."""
    engine = db.create_engine(old_schema_url, pool_size=1)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO endpoints (name, kind, url, signing_secret) VALUES ('hook', "
                "'webhook', 'http://127.0.0.1:9/hook', 'whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256) "
                "VALUES (repeat('a', 64), 'hook', '{}', 'x')"
            )
        )
    yield engine
    engine.dispose()


def snapshot(engine: Engine) -> dict[str, Any]:
    """Every table's rows (a digest), the catalog and the revisions: what "changed
    nothing" compares."""
    with engine.connect() as conn:
        tables = conn.execute(
            sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        ).scalars()
        digest = "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t"
        found: dict[str, Any] = {
            table: conn.execute(sa.text(digest.format(f'"{table}"'))).scalar()
            for table in list(tables)
        }
        found["catalog"] = conn.execute(
            sa.text(
                "SELECT md5(string_agg(format('%s %s %s', c.relname, c.relkind, c.relnatts), ',' "
                "ORDER BY c.relname)) FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace"
            )
        ).scalar()
    return found


def refuses(argv: list[str], url: str, engine: Engine) -> str:
    """Run this release's command on the old schema; its one line on stderr."""
    before = snapshot(engine)
    done = run(argv, previous.clean_env(DATABASE_URL=url))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert snapshot(engine) == before
    assert f"revision {OLD}" in lines[0] and f"needs revision {revisions.head()}" in lines[0]
    assert "run `outbox db upgrade` first" in lines[0]
    return lines[0]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_this_releases_dispatcher_refuses_the_previous_schema_and_claims_nothing(
    old_schema_url: str, old_engine: Engine, processes: str
) -> None:
    argv = new_outbox("dispatcher", "run", "--processes", processes)
    assert refuses(argv, old_schema_url, old_engine).startswith(
        "outbox: error: the dispatcher refuses to start and changed nothing"
    )


def test_this_releases_api_refuses_to_serve_on_the_previous_schema(
    old_schema_url: str, old_engine: Engine
) -> None:
    argv = new_outbox("api", "serve", "--port", str(scratch.free_port()))
    assert "the API refuses to start" in refuses(argv, old_schema_url, old_engine)


def test_this_releases_billing_job_refuses_before_its_migration_and_spark(
    old_schema_url: str, old_engine: Engine, tmp_path: Path
) -> None:
    """Nothing of the job ran: not the example's own migration (billing@head), not Spark."""
    (tmp_path / "events-2026-01-01.json").write_text("")
    argv = new_outbox("spark", "run", "billing", "--input", str(tmp_path), "--date", "2026-01-01")
    assert "the Spark sink refuses to start" in refuses(argv, old_schema_url, old_engine)


def test_this_releases_verify_refuses_the_previous_schema(
    old_schema_url: str, old_engine: Engine
) -> None:
    line = refuses(new_outbox("verify", "--once"), old_schema_url, old_engine)
    assert "outbox verify refuses to start" in line


def test_a_database_never_migrated_is_named_as_such(empty_url: str) -> None:
    done = run(new_outbox("dispatcher", "run"), previous.clean_env(DATABASE_URL=empty_url))
    assert done.returncode == 2
    assert "has no outbox schema (never migrated)" in done.stderr, done.stderr


@pytest.mark.spark
def test_the_sink_refuses_the_previous_schema_before_any_executor_writes(
    old_schema_url: str, old_engine: Engine, spark: Any
) -> None:
    from spark_outbox.spark.sink import OutboxSink

    effects = spark.createDataFrame(
        [("b" * 64, "hook", '{"n": 1}')], "idempotency_key string, endpoint string, payload string"
    )
    before = snapshot(old_engine)
    sink = OutboxSink(job="upgrade-refusal", database_url=old_schema_url)
    with pytest.raises(revisions.SchemaBehind, match=f"revision {OLD}.*outbox db upgrade"):
        sink.write(None, effects, batch_id=dt.date(2026, 1, 1).isoformat())
    assert snapshot(old_engine) == before
