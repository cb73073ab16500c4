"""Scratch databases and free ports, for the demo, the tests and the benches.

One helper for every place that creates a throw-away database: the demo gives
each run a fresh one, ``--crash`` a second for the clean reference run, every
test a clone of a template built by the real migrations, every bench its own.
Identifiers are quoted by psycopg2 (``sql.Identifier``), never formatted in by
hand; errors become ``DatabaseUnavailable`` naming the server and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import psycopg2.errors
from psycopg2 import sql
from sqlalchemy.engine import make_url

from spark_outbox.core import db
from spark_outbox.core.errors import DatabaseUnavailable

# The spark_outbox namespace, installed or in the repository (its folder of links).
PACKAGE = Path(__file__).absolute().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def with_database(url: str, name: str) -> str:
    """The same server URL, pointing at database ``name``."""
    return make_url(db.sqlalchemy_url(url)).set(database=name).render_as_string(hide_password=False)


def database_name(url: str) -> str:
    return str(make_url(db.sqlalchemy_url(url)).database)


@contextlib.contextmanager
def _admin(server_url: str) -> Iterator[psycopg2.extensions.cursor]:
    """An autocommit cursor on the server's ``postgres`` database."""
    try:
        conn = psycopg2.connect(db.libpq_url(with_database(server_url, "postgres")))
    except psycopg2.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach {db.redact(server_url)}: {exc}") from exc
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            yield cur
    except psycopg2.Error as exc:
        raise DatabaseUnavailable(
            f"administration failed on {db.redact(server_url)}: {exc}; the role needs CREATEDB"
        ) from exc
    finally:
        conn.close()


def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` (empty, or a clone of ``template``); return its URL."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with _admin(server_url) as cur:
        cur.execute(statement)
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    """Drop ``name`` if it exists, closing its sessions.

    ``WITH (FORCE)`` refuses a role without superuser while an autovacuum worker is
    in the database (PostgreSQL 15 checks its right to terminate that worker: "must
    be a member of the role whose process is being terminated"): then our own
    sessions are closed by hand and a plain DROP, which cancels autovacuum itself,
    follows."""
    database = sql.Identifier(name)
    with _admin(server_url) as cur:
        try:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        except psycopg2.errors.InsufficientPrivilege:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND usename = current_user AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(database))


def recreate_database(server_url: str, name: str) -> str:
    """Drop ``name`` if it exists, create it empty; return its URL."""
    drop_database(server_url, name)
    return create_database(server_url, name)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def schema_fingerprint() -> str:
    """A hash of everything that shapes the migrated schema (a migration may run an
    objects file's text: spark_outbox.core.objects)."""
    h = hashlib.sha256()
    sources = [
        *sorted((PACKAGE / "migrations").rglob("*.py")),
        *sorted((PACKAGE / "core").rglob("*.sql")),
        PACKAGE / "core" / "schema.py",
        PACKAGE / "billing" / "schema.py",
    ]
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def ensure_template(server_url: str) -> str:
    """Create (once) a database migrated to every head, marked as a template; its name.

    The name carries a hash of the schema and migration sources, so a changed
    migration builds a new template and an unchanged one is reused across runs
    (cloning takes ~0.1 s; migrating from scratch ~1 s).
    """
    name = f"outbox_tpl_{schema_fingerprint()}"
    building = f"{name}_building"
    with _admin(server_url) as cur:
        # Serialise template builds across parallel test processes.
        cur.execute("SELECT pg_advisory_lock(hashtext('spark-outbox-template'))")
        try:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(building))
                cur.execute(drop)
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                db.upgrade(with_database(server_url, building), db.ALL_HEADS)
                cur.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
                cur.execute(
                    sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true").format(sql.Identifier(name))
                )
        finally:
            cur.execute("SELECT pg_advisory_unlock(hashtext('spark-outbox-template'))")
    return name


def clone_template(server_url: str, template: str, prefix: str = "t") -> str:
    """A fresh database cloned from ``template``; its URL."""
    return create_database(server_url, unique_name(prefix), template=template)


def create_empty_database(server_url: str, prefix: str = "t") -> str:
    return create_database(server_url, unique_name(prefix))
