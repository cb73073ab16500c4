"""The objects files (dispatcher/core/objects/*.sql) are the current text of every view,
function and trigger: built over the tables alone they give the catalog the
migrations give, run again over head they change nothing, and they leave none out."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, objects
from spark_outbox.core.schema import metadata

# Each object as PostgreSQL prints it back: the stored definition, not our text,
# so layout and comments outside a function's body do not count; a body does.
CATALOG = sa.text("""
SELECT 'view', c.relname, pg_get_viewdef(c.oid)
  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')
UNION ALL
SELECT 'function', p.proname, pg_get_functiondef(p.oid)
  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger', t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t WHERE NOT t.tgisinternal
""")

CREATES = re.compile(r"^CREATE (?:OR REPLACE )?(?:VIEW|FUNCTION|TRIGGER) (\w+)", re.MULTILINE)


def catalog(conn: sa.Connection) -> dict[tuple[str, str], str]:
    rows = conn.execute(CATALOG).all()
    found = {(kind, name): definition for kind, name, definition in rows}
    assert len(found) == len(rows), "two objects of one kind share a name"
    return found


def catalog_of(url: str) -> dict[tuple[str, str], str]:
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return catalog(conn)
    finally:
        engine.dispose()


@pytest.fixture
def tables_url(server_url: str) -> Iterator[str]:
    """A database with the tables of core.schema and the objects files, no migration."""
    url = scratch.create_empty_database(server_url)
    try:
        engine = db.create_engine(url, pool_size=1)
        try:
            with engine.begin() as conn:
                metadata.create_all(conn)
                objects.apply(conn)
        finally:
            engine.dispose()
        yield url
    finally:
        scratch.drop_database(server_url, scratch.database_name(url))


def test_the_objects_files_over_the_tables_build_what_the_migrations_build(
    tables_url: str, db_url: str
) -> None:
    from_files, from_migrations = catalog_of(tables_url), catalog_of(db_url)
    assert sorted(from_files) == sorted(from_migrations)
    for key, definition in from_migrations.items():
        assert from_files[key] == definition, key


def test_running_the_objects_files_again_over_head_changes_nothing(engine: sa.Engine) -> None:
    # What a new migration does with them: the text re-applies cleanly, and is head's.
    with engine.connect() as conn:
        before = catalog(conn)
        objects.apply(conn)
        after = catalog(conn)
        conn.rollback()
    assert after == before


def test_every_object_the_migrations_create_is_in_one_objects_file(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        migrated = {name for _, name in catalog(conn)}
    assert migrated == set(objects.names())
    for name in objects.names():
        assert CREATES.findall(objects.text(name)) == [name], name


def test_an_unknown_object_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(LookupError, match=r"'due_efects'.*use one of .*\bdue_effects\b"):
        objects.text("due_efects")
    with pytest.raises(LookupError, match=r"dew\.sql .*use one of .*\bdue\b"):
        objects.concern("dew")


def test_an_object_in_two_files_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = "-- name: one_view\nCREATE OR REPLACE VIEW one_view AS SELECT 1 AS one;\n"
    (tmp_path / "first.sql").write_text(view)
    (tmp_path / "second.sql").write_text(view)
    monkeypatch.setattr(objects, "DIRECTORY", tmp_path)
    with pytest.raises(ValueError, match=r"one_view .* first\.sql and second\.sql"):
        objects.text("one_view")


def test_the_template_is_rebuilt_when_an_objects_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A migration may run an objects file's text: a changed file is a changed schema.
    root = tmp_path / "spark_outbox"
    for path in ("migrations", "core/objects", "billing"):
        (root / path).mkdir(parents=True)
    (root / "core" / "schema.py").write_text("")
    (root / "billing" / "schema.py").write_text("")
    due = root / "core" / "objects" / "due.sql"
    due.write_text(objects.concern("due"))
    monkeypatch.setattr(scratch, "PACKAGE", root)
    before = scratch.schema_fingerprint()
    due.write_text(objects.concern("due").replace("<= now()", "< now()"))
    assert scratch.schema_fingerprint() != before
