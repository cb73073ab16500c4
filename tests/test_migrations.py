"""The schema changes only through Alembic, and the migrations match the tables."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from spark_outbox.billing import schema as billing_schema
from spark_outbox.cli.tools import pgcluster, scratch
from spark_outbox.core import db, revisions
from spark_outbox.core.schema import metadata


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    url = scratch.create_empty_database(server_url)
    yield url
    scratch.drop_database(server_url, scratch.database_name(url))


def _tables(url: str) -> set[str]:
    engine = db.create_engine(url, pool_size=1)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_each_branch_has_a_single_head() -> None:
    script = ScriptDirectory.from_config(db.alembic_config("postgresql://x@h/x"))
    heads = script.get_heads()
    labels = sorted(label for head in heads for label in script.get_revision(head).branch_labels)
    assert len(heads) == 2 and labels == ["billing", "outbox"]


def test_upgrade_from_empty_to_head_and_back_down(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, db.ALL_HEADS)
    assert set(metadata.tables) | set(billing_schema.metadata.tables) <= _tables(empty_db_url)
    db.downgrade(empty_db_url, "base")
    assert _tables(empty_db_url) <= {"alembic_version"}
    db.upgrade(empty_db_url, db.ALL_HEADS)  # and up again: downgrade left nothing behind
    assert set(metadata.tables) | set(billing_schema.metadata.tables) <= _tables(empty_db_url)


def test_a_deployment_gets_the_outbox_schema_without_the_example_table(
    empty_db_url: str,
) -> None:
    db.upgrade(empty_db_url)
    tables = _tables(empty_db_url)
    assert set(metadata.tables) <= tables and "invoices" not in tables
    engine = db.create_engine(empty_db_url, pool_size=1)
    try:
        assert revisions.read(engine).current == revisions.head()
    finally:
        engine.dispose()


def test_migrations_and_tables_do_not_drift(db_url: str) -> None:
    command.check(db.alembic_config(db_url))


def test_operator_actions_are_append_only(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO operator_actions (actor, action, target, reason) "
                "VALUES ('ops', 'pause', 'endpoint:x', 'test')"
            )
        )
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("UPDATE operator_actions SET reason = 'rewritten'"))
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM operator_actions"))


def test_claim_index_is_partial_on_due_states(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        indexdef = conn.execute(
            sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_effects_due'")
        ).scalar_one()
    assert "WHERE" in indexdef and "pending" in indexdef and "leased" in indexdef


def test_staging_tables_are_unlogged(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                sa.text(
                    "SELECT relname, relpersistence FROM pg_class "
                    "WHERE relname IN ('staged_rejects', 'staged_results', 'deferred_effects', "
                    "'effects')"
                )
            ).all()
        )
    assert rows == {
        "staged_rejects": "u",
        "staged_results": "u",
        "deferred_effects": "p",  # losing one would lose an effect: logged
        "effects": "p",
    }


_CATALOG = """
SELECT 'column', table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
  FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL SELECT 'constraint', conrelid::regclass || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL SELECT 'view', viewname || ' ' || definition FROM pg_views WHERE schemaname = 'public'
UNION ALL SELECT 'trigger', tgrelid::regclass || ' ' || tgname
  FROM pg_trigger WHERE NOT tgisinternal
UNION ALL SELECT 'version', version_num FROM alembic_version
"""


def _catalog(url: str) -> set[tuple[str, str]]:
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return {(kind, text) for kind, text in conn.execute(sa.text(_CATALOG))}
    finally:
        engine.dispose()


def test_db_sql_output_builds_the_same_schema_as_the_migrations(
    server_url: str, empty_db_url: str
) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "spark_outbox", "db", "sql"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    psql = scratch.create_empty_database(server_url)
    try:
        # Run as psql runs it (the output is meant for it): statement by statement,
        # so an index built CONCURRENTLY after its revision's COMMIT can be built.
        psql_bin = str(pgcluster.find_bin_dir() / "psql")
        subprocess.run(
            [psql_bin, "-qX", "-v", "ON_ERROR_STOP=1", "-f", "-", "-d", db.libpq_url(psql)],
            input=printed,
            capture_output=True,
            text=True,
            check=True,
        )
        db.upgrade(empty_db_url)
        from_sql, from_migrations = _catalog(psql), _catalog(empty_db_url)
        assert from_sql == from_migrations
        assert {kind for kind, _ in from_sql} >= {"view", "trigger", "index", "version"}
    finally:
        scratch.drop_database(server_url, scratch.database_name(psql))


def _endpoint_checks(url: str) -> dict[str, str]:
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                    " WHERE conrelid IN ('endpoints'::regclass, 'endpoint_budgets'::regclass)"
                    " AND contype = 'c'"
                )
            ).all()
        return {str(name): str(text) for name, text in found}
    finally:
        engine.dispose()


def test_the_endpoint_bounds_of_the_tables_and_of_the_migrations_agree(
    server_url: str, empty_db_url: str
) -> None:
    """alembic check does not compare CHECK constraints: the ones schema.py builds from
    dispatcher/bounds.py and the ones migration 1525 writes out are compared here."""
    db.upgrade(empty_db_url)
    from_tables = scratch.create_empty_database(server_url)
    try:
        engine = db.create_engine(from_tables, pool_size=1)
        try:
            tables = [metadata.tables["endpoints"], metadata.tables["endpoint_budgets"]]
            metadata.create_all(engine, tables=tables)
        finally:
            engine.dispose()
        migrated, declared = _endpoint_checks(empty_db_url), _endpoint_checks(from_tables)
        assert {n for n in migrated if n.endswith("_bounds")} == {
            "ck_endpoints_timeout_s_bounds",
            "ck_endpoints_rate_limit_per_s_bounds",
            "ck_endpoints_max_in_flight_bounds",
            "ck_endpoints_smtp_port_bounds",
            "ck_endpoints_retry_schedule_s_bounds",
        }
        assert migrated == declared
    finally:
        scratch.drop_database(server_url, scratch.database_name(from_tables))


def test_an_upgrade_with_an_endpoint_out_of_bounds_stops_naming_it_and_the_fix(
    empty_db_url: str,
) -> None:
    db.upgrade(empty_db_url, "2001")
    engine = db.create_engine(empty_db_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO endpoints (name, kind, url, signing_secret, rate_limit_per_s)"
                    " VALUES ('loud', 'webhook', 'http://x/h', 'whsec_x', 1e308)"
                )
            )
    finally:
        engine.dispose()
    with pytest.raises(sa.exc.DBAPIError, match=r"loud \(rate_limit_per_s: --rate-limit-per-s\)"):
        db.upgrade(empty_db_url)


def test_the_send_by_revision_runs_again_after_its_concurrent_part_failed(
    empty_db_url: str,
) -> None:
    """2720 commits its first part before it validates and builds CONCURRENTLY: if
    that part fails (say an index build), the revision stays unrecorded, and an
    upgrade run again must redo it from the start over what was committed."""
    db.upgrade(empty_db_url, "outbox@2720")
    at_2720 = _catalog(empty_db_url)
    engine = db.create_engine(empty_db_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '2730'"))
            conn.execute(sa.text("DROP INDEX ix_effects_expired"))
    finally:
        engine.dispose()
    db.upgrade(empty_db_url, "outbox@2720")
    assert _catalog(empty_db_url) == at_2720


def test_the_ledger_at_deletion_revision_keeps_every_delivered_key_both_ways(
    empty_db_url: str,
) -> None:
    """2812: at head a delivery writes no ledger row and a DELETE writes the key; its
    downgrade first writes the keys of the delivered effects still there, as the
    release before it expects of every delivery."""
    db.upgrade(empty_db_url)
    engine = db.create_engine(empty_db_url, pool_size=1)
    insert = sa.text(
        "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, state,"
        " delivered_at) VALUES (:k, 'hook', '{}', 'x', 'delivered', now())"
    )
    ledger = sa.text("SELECT idempotency_key FROM key_ledger ORDER BY 1")
    try:
        with engine.begin() as conn:
            for key in ("a" * 64, "b" * 64):
                conn.execute(insert, {"k": key})
            conn.execute(sa.text("DELETE FROM effects WHERE idempotency_key = :k"), {"k": "a" * 64})
        with engine.connect() as conn:
            assert conn.execute(ledger).scalars().all() == ["a" * 64]
        db.downgrade(empty_db_url, "outbox@2811")
        with engine.connect() as conn:
            assert conn.execute(ledger).scalars().all() == ["a" * 64, "b" * 64]
        db.upgrade(empty_db_url)
        with engine.begin() as conn:
            conn.execute(insert, {"k": "c" * 64})
            conn.execute(sa.text("DELETE FROM effects"))
        with engine.connect() as conn:
            assert conn.execute(ledger).scalars().all() == ["a" * 64, "b" * 64, "c" * 64]
    finally:
        engine.dispose()
